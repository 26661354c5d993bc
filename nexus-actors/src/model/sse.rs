//! A small server-sent events parser: bytes in, events out.
//!
//! Follows the event-stream grammar of the HTML standard ("Parsing an event stream") as far as a
//! model provider needs it: lines end with `\n`, `\r\n` or `\r` (a `\r\n` split across two
//! chunks counts once); a line starting with `:` is a comment; `field:value` drops one space after
//! the colon; `data` lines join with `\n`; `event` names the event; a blank line dispatches the
//! event when it has data; `id` and `retry` are ignored (nothing here reconnects). Bytes are
//! buffered until a line is complete, so a UTF-8 character split across chunks is decoded whole;
//! invalid UTF-8 is replaced, never an error. An event without a trailing blank line at the end of
//! the body is dropped, as the standard says. A line or an event over
//! [`STREAM_EVENT_BOUND`] bytes is not buffered: the parser reports [`SseParser::oversize`] and the
//! reader refuses the answer.

use super::bounds::STREAM_EVENT_BOUND;

/// One dispatched event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, `None` when the event named none (the standard's `message`).
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

/// The parser's state between chunks. Feed it with [`SseParser::push`].
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of the line not yet ended.
    line: Vec<u8>,
    /// The last chunk ended with `\r`: a `\n` starting the next chunk belongs to it.
    after_cr: bool,
    event: Option<String>,
    data: String,
    has_data: bool,
    /// A line or an event grew over [`STREAM_EVENT_BOUND`]: the stream is refused.
    oversize: bool,
}

impl SseParser {
    /// Whether a line or an event grew over [`STREAM_EVENT_BOUND`] bytes: what follows cannot be
    /// read as the provider meant it, so the answer is refused.
    #[must_use]
    pub fn oversize(&self) -> bool {
        self.oversize
    }

    /// Parses one chunk of the body and returns the events it completed, in order.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        for &byte in chunk {
            if std::mem::take(&mut self.after_cr) && byte == b'\n' {
                continue;
            }
            match byte {
                b'\n' | b'\r' => {
                    self.after_cr = byte == b'\r';
                    let line = std::mem::take(&mut self.line);
                    if let Some(event) = self.line_done(&line) {
                        events.push(event);
                    }
                }
                _ if self.line.len() + self.data.len() >= STREAM_EVENT_BOUND => self.oversize = true,
                _ => self.line.push(byte),
            }
        }
        events
    }

    fn line_done(&mut self, line: &[u8]) -> Option<SseEvent> {
        if line.is_empty() {
            let event = self.event.take();
            let data = std::mem::take(&mut self.data);
            return std::mem::take(&mut self.has_data).then_some(SseEvent { event, data });
        }
        if line.starts_with(b":") {
            return None;
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_ref(), ""),
        };
        match field {
            "data" => {
                if self.data.len() + value.len() >= STREAM_EVENT_BOUND {
                    self.oversize = true;
                    return None;
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_owned()),
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(name: Option<&str>, data: &str) -> SseEvent {
        SseEvent { event: name.map(str::to_owned), data: data.to_owned() }
    }

    fn parse_all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut parser = SseParser::default();
        chunks.iter().flat_map(|chunk| parser.push(chunk)).collect()
    }

    #[test]
    fn grammar_rows() {
        /// (row, the body's chunks, the events they give).
        type Row = (&'static str, Vec<&'static [u8]>, Vec<SseEvent>);
        let rows: Vec<Row> = vec![
            ("one_event", vec![b"data: {\"a\":1}\n\n"], vec![event(None, "{\"a\":1}")]),
            (
                "named_events",
                vec![b"event: ping\ndata: {}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"],
                vec![event(Some("ping"), "{}"), event(Some("message_stop"), "{\"type\":\"message_stop\"}")],
            ),
            ("multi_line_data_joins_with_newline", vec![b"data: a\ndata: b\n\n"], vec![event(None, "a\nb")]),
            ("no_space_after_colon", vec![b"data:x\n\n"], vec![event(None, "x")]),
            ("only_one_space_is_dropped", vec![b"data:  x\n\n"], vec![event(None, " x")]),
            (
                "comments_and_unknown_fields_ignored",
                vec![b": keep-alive\nid: 7\nretry: 10\ndata: y\n\n"],
                vec![event(None, "y")],
            ),
            ("crlf_lines", vec![b"data: a\r\n\r\n"], vec![event(None, "a")]),
            ("cr_lines", vec![b"data: a\r\rdata: b\r\r"], vec![event(None, "a"), event(None, "b")]),
            ("crlf_split_across_chunks", vec![b"data: a\r", b"\n\r", b"\n"], vec![event(None, "a")]),
            ("line_split_across_chunks", vec![b"da", b"ta: he", b"llo\n", b"\n"], vec![event(None, "hello")]),
            ("utf8_split_across_chunks", vec![b"data: \xc3", b"\xa9\n\n"], vec![event(None, "\u{e9}")]),
            ("blank_lines_without_data_dispatch_nothing", vec![b"\n\nevent: x\n\n"], vec![]),
            ("empty_data_line_is_an_event", vec![b"data\n\n"], vec![event(None, "")]),
            ("unterminated_event_is_dropped", vec![b"data: cut"], vec![]),
            ("done_marker", vec![b"data: [DONE]\n\n"], vec![event(None, "[DONE]")]),
        ];
        for (name, chunks, expected) in rows {
            assert_eq!(parse_all(&chunks), expected, "{name}");
        }
    }

    #[test]
    fn byte_at_a_time_equals_whole() {
        let body =
            b"event: content_block_delta\r\ndata: {\"delta\":{\"text\":\"h\xc3\xa9\"}}\r\n\r\n: c\ndata: [DONE]\n\n";
        let whole = parse_all(&[body]);
        let mut parser = SseParser::default();
        let split: Vec<SseEvent> = body.iter().flat_map(|b| parser.push(std::slice::from_ref(b))).collect();
        assert_eq!(whole.len(), 2);
        assert_eq!(whole, split);
        assert_eq!(whole[0].event.as_deref(), Some("content_block_delta"));
        assert!(whole[0].data.contains("h\u{e9}"));
    }
}
