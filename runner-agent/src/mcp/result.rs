//! A `tools/call` result as the model reads it: the text of the text blocks, in order, and a
//! short line for each block of another kind (an image or audio clip is described, never
//! inlined; an embedded text resource is shown with its URI).

use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};
use serde_json::Value;

use crate::tools::ToolOutcome;

/// The outcome of a completed call: `content` is the blocks as text (joined by newlines),
/// `structured_content` the MCP `structuredContent` (or null), `is_error` the MCP `isError`.
pub(crate) fn outcome(result: CallToolResult) -> ToolOutcome {
    let content = result.content.iter().map(describe).collect::<Vec<_>>().join("\n");
    ToolOutcome::Completed {
        content,
        structured_content: result.structured_content.unwrap_or(Value::Null),
        is_error: result.is_error.unwrap_or(false),
    }
}

fn describe(block: &ContentBlock) -> String {
    match block {
        ContentBlock::Text(text) => text.text.clone(),
        ContentBlock::Image(image) => {
            format!("[image: {}, {} bytes of base64, not shown]", image.mime_type, image.data.len())
        }
        ContentBlock::Audio(audio) => {
            format!("[audio: {}, {} bytes of base64, not shown]", audio.mime_type, audio.data.len())
        }
        ContentBlock::Resource(embedded) => match &embedded.resource {
            ResourceContents::TextResourceContents { uri, text, .. } => format!("[resource {uri}]\n{text}"),
            ResourceContents::BlobResourceContents { uri, mime_type, blob, .. } => format!(
                "[resource {uri}: {}, {} bytes of base64, not shown]",
                mime_type.as_deref().unwrap_or("binary"),
                blob.len()
            ),
            _ => "[an embedded resource of a kind this runner does not show]".to_owned(),
        },
        ContentBlock::ResourceLink(link) => format!("[resource link: {} <{}>]", link.name, link.uri),
        // A block kind newer than this runner.
        _ => "[a content block of a kind this runner does not show]".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn result(value: Value) -> CallToolResult {
        serde_json::from_value(value).expect("a CallToolResult")
    }

    #[test]
    fn text_blocks_are_joined_and_other_blocks_described() {
        let got = outcome(result(json!({
            "content": [
                {"type": "text", "text": "first"},
                {"type": "image", "data": "AAAA", "mimeType": "image/png"},
                {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "inside"}},
                {"type": "resource", "resource": {"uri": "file:///b.bin", "blob": "AAAAAAAA", "mimeType": "application/zip"}},
                {"type": "resource_link", "uri": "file:///c", "name": "c"},
                {"type": "text", "text": "last"},
            ],
            "structuredContent": {"sum": 3},
        })));
        let ToolOutcome::Completed { content, structured_content, is_error } = got else {
            panic!("completed");
        };
        assert_eq!(
            content,
            "first\n[image: image/png, 4 bytes of base64, not shown]\n[resource file:///a.txt]\ninside\n\
             [resource file:///b.bin: application/zip, 8 bytes of base64, not shown]\n\
             [resource link: c <file:///c>]\nlast"
        );
        assert_eq!(structured_content, json!({"sum": 3}));
        assert!(!is_error);
    }

    #[test]
    fn is_error_and_missing_structured_content() {
        let got = outcome(result(json!({"content": [{"type": "text", "text": "no"}], "isError": true})));
        assert_eq!(
            got,
            ToolOutcome::Completed { content: "no".into(), structured_content: Value::Null, is_error: true }
        );
    }
}
