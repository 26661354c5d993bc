//! HTML to readable text, in time linear in the input whatever its shape.
//!
//! html2text gives the better text (lists, tables, link footnotes) but takes time quadratic in
//! the nesting depth (a page of 20,000 nested `<div>`s takes seconds). So a page goes to it only
//! when it is at most [`HTML2TEXT_MAX_BYTES`] and its estimated depth at most [`MAX_DEPTH`];
//! any other page goes through [`strip`], a one-pass tag stripper.

/// The largest page html2text converts (2 MiB); a larger one is stripped.
pub(super) const HTML2TEXT_MAX_BYTES: usize = 2 * 1024 * 1024;
/// The deepest estimated nesting html2text converts; a deeper page is stripped.
pub(super) const MAX_DEPTH: usize = 512;
/// Columns html2text wraps to.
const WIDTH: usize = 100;

/// Elements that never have an end tag.
const VOID: [&str; 14] =
    ["area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr"];
/// Elements whose text is not shown.
const HIDDEN: [&str; 5] = ["script", "style", "head", "noscript", "template"];
/// Elements that start a new line.
const BLOCK: [&str; 22] = [
    "p",
    "div",
    "br",
    "li",
    "ul",
    "ol",
    "tr",
    "table",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "pre",
    "blockquote",
    "section",
    "article",
    "header",
    "footer",
    "hr",
    "dd",
];

/// Readable text of `html` (UTF-8, invalid bytes replaced).
pub(super) fn to_text(html: &[u8]) -> String {
    if html.len() <= HTML2TEXT_MAX_BYTES
        && estimated_depth(html) <= MAX_DEPTH
        && let Ok(text) = html2text::from_read(html, WIDTH)
    {
        return text;
    }
    strip(&String::from_utf8_lossy(html))
}

/// One tag: its lowercase name, whether it closes, whether it closes itself, and where it ends.
struct Tag {
    name: String,
    closing: bool,
    self_closing: bool,
    end: usize,
}

/// What starts at a `<`.
enum Scan {
    Tag(Tag),
    /// A lone `<`, a comment or a declaration.
    NotATag,
    /// No `>` follows: nothing after is a tag either.
    NoMoreTags,
}

/// What starts at `at` (a `<`). Scans forward only to the tag's `>`, and a caller that gets
/// [`Scan::NoMoreTags`] stops, so a whole document is scanned in linear time.
fn scan_at(text: &[u8], at: usize) -> Scan {
    match tag_at(text, at) {
        Some(Some(tag)) => Scan::Tag(tag),
        Some(None) => Scan::NoMoreTags,
        None => Scan::NotATag,
    }
}

/// `None`: not a tag; `Some(None)`: a tag's start with no `>` after it.
fn tag_at(text: &[u8], at: usize) -> Option<Option<Tag>> {
    let mut i = at + 1;
    let closing = text.get(i) == Some(&b'/');
    if closing {
        i += 1;
    }
    let start = i;
    while text.get(i).is_some_and(|b| b.is_ascii_alphanumeric()) {
        i += 1;
    }
    if i == start {
        return None;
    }
    let name = String::from_utf8_lossy(&text[start..i]).to_ascii_lowercase();
    let Some(offset) = text[i..].iter().position(|b| *b == b'>') else {
        return Some(None);
    };
    let close = i + offset;
    Some(Some(Tag { name, closing, self_closing: text[close - 1] == b'/', end: close + 1 }))
}

/// The nesting depth an HTML document reaches, counting every open tag that is not void or
/// self-closed as one level until its end tag. Implied ends (`<p>` without `</p>`) count as
/// still open, so the estimate is never below the real depth.
pub(super) fn estimated_depth(html: &[u8]) -> usize {
    let mut depth: usize = 0;
    let mut deepest = 0;
    let mut at = 0;
    while let Some(offset) = html[at..].iter().position(|b| *b == b'<') {
        let start = at + offset;
        let tag = match scan_at(html, start) {
            Scan::Tag(tag) => tag,
            Scan::NotATag => {
                at = start + 1;
                continue;
            }
            Scan::NoMoreTags => break,
        };
        if tag.closing {
            depth = depth.saturating_sub(1);
        } else if !tag.self_closing && !VOID.contains(&tag.name.as_str()) {
            depth += 1;
            deepest = deepest.max(depth);
        }
        at = tag.end;
    }
    deepest
}

/// Text without tags: hidden elements (scripts, styles, the head) dropped, comments dropped,
/// block elements on lines of their own, the common entities decoded, runs of blanks collapsed.
pub(super) fn strip(html: &str) -> String {
    let bytes = html.as_bytes();
    let mut out = String::with_capacity(html.len() / 2);
    let mut at = 0;
    let mut text_from = 0;
    while at < bytes.len() {
        if bytes[at] != b'<' {
            at += 1;
            continue;
        }
        push_text(&mut out, &html[text_from..at]);
        if html[at..].starts_with("<!--") {
            at = html[at..].find("-->").map_or(bytes.len(), |end| at + end + 3);
            text_from = at;
            continue;
        }
        let tag = match scan_at(bytes, at) {
            Scan::Tag(tag) => tag,
            Scan::NotATag if bytes.get(at + 1) == Some(&b'!') => {
                // A `<!DOCTYPE>` or the like.
                at = html[at..].find('>').map_or(bytes.len(), |end| at + end + 1);
                text_from = at;
                continue;
            }
            Scan::NotATag => {
                // A lone `<` is text.
                text_from = at;
                at += 1;
                continue;
            }
            Scan::NoMoreTags => {
                text_from = at;
                break;
            }
        };
        at = tag.end;
        if !tag.closing && !tag.self_closing && HIDDEN.contains(&tag.name.as_str()) {
            // Skip to the matching end tag.
            let end_tag = format!("</{}", tag.name);
            at = find_ignore_case(&html[at..], &end_tag)
                .map_or(bytes.len(), |end| html[at + end..].find('>').map_or(bytes.len(), |gt| at + end + gt + 1));
        } else if BLOCK.contains(&tag.name.as_str()) && !out.ends_with('\n') && !out.is_empty() {
            out.push('\n');
        }
        text_from = at;
    }
    push_text(&mut out, &html[text_from.min(html.len())..]);
    let mut lines: Vec<&str> = out.lines().map(str::trim).collect();
    lines.dedup_by(|a, b| a.is_empty() && b.is_empty());
    lines.join("\n").trim().to_owned()
}

fn find_ignore_case(haystack: &str, needle: &str) -> Option<usize> {
    let needle = needle.as_bytes();
    haystack.as_bytes().windows(needle.len()).position(|window| window.eq_ignore_ascii_case(needle))
}

/// Appends `text` with entities decoded and blank runs collapsed to one space.
fn push_text(out: &mut String, text: &str) {
    let decoded = decode_entities(text);
    let mut blank = out.ends_with([' ', '\n']) || out.is_empty();
    for ch in decoded.chars() {
        if ch.is_whitespace() {
            if !blank {
                out.push(' ');
                blank = true;
            }
        } else {
            out.push(ch);
            blank = false;
        }
    }
}

fn decode_entities(text: &str) -> String {
    if !text.contains('&') {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let entity = rest.find(';').filter(|end| *end <= 10).map(|end| (&rest[1..end], end));
        let decoded = entity.and_then(|(name, end)| {
            let ch = match name {
                "amp" => Some('&'),
                "lt" => Some('<'),
                "gt" => Some('>'),
                "quot" => Some('"'),
                "apos" | "#39" => Some('\''),
                "nbsp" => Some(' '),
                _ => name
                    .strip_prefix("#x")
                    .or_else(|| name.strip_prefix("#X"))
                    .map(|hex| u32::from_str_radix(hex, 16).ok())
                    .or_else(|| name.strip_prefix('#').map(|dec| dec.parse::<u32>().ok()))
                    .flatten()
                    .and_then(char::from_u32),
            };
            ch.map(|ch| (ch, end))
        });
        match decoded {
            Some((ch, end)) => {
                out.push(ch);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strip_keeps_the_text_and_drops_tags_scripts_and_comments() {
        let html = "<!DOCTYPE html><html><head><title>T</title><style>p { color: red }</style></head>\
                    <body><h1>Title</h1><!-- note --><p>One &amp; <b>two</b>&nbsp;&lt;3&gt; &#233;&#x41;</p>\
                    <SCRIPT>var x = '<p>';</SCRIPT><ul><li>a</li><li>b</li></ul>1 < 2<br/>end</body></html>";
        assert_eq!(strip(html), "Title\nOne & two <3> éA\na\nb\n1 < 2\nend");
        assert_eq!(strip("no tags at all,   just   text"), "no tags at all, just text");
        assert_eq!(strip("<p>unterminated <script>forever"), "unterminated");
    }

    #[test]
    fn depth_is_estimated_from_open_and_end_tags() {
        assert_eq!(estimated_depth(b"<div><p>a</p><br><img src=x/><p>b</p></div>"), 2);
        assert_eq!(estimated_depth("<div>".repeat(1000).as_bytes()), 1000);
        assert_eq!(estimated_depth(b"1 < 2 and <!-- x -->"), 0);
    }

    #[test]
    fn deep_or_large_pages_are_stripped_quickly_and_others_go_to_html2text() {
        let depth = 200_000;
        let deep = format!("{}deep{}", "<div>".repeat(depth), "</div>".repeat(depth));
        let started = tokio::time::Instant::now();
        assert_eq!(to_text(deep.as_bytes()), "deep");
        // No `>` after a tag's start: still one pass.
        assert_eq!(strip(&"<a".repeat(200_000)).len(), 400_000, "shown as the text it is");
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "took {:?}", started.elapsed());
        // A shallow page gets html2text's rendering: a list keeps its bullets.
        let text = to_text(b"<ul><li>first</li><li>second</li></ul>");
        assert!(text.contains("* first") && text.contains("* second"), "{text}");
    }
}
