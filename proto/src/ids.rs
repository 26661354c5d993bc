//! Id newtypes: one type per kind of public id, each a UUID underneath, so an execution's id can
//! never be passed where a runner's is expected. They print as the UUID's lowercase hyphenated
//! text and serialize as that string.
//!
//! An id has one spelling on the doors: [`FromStr`](std::str::FromStr) takes only the canonical
//! lowercase hyphenated form (`0e5e…-…`, 36 characters) and refuses upper case, braces,
//! `urn:uuid:` and the undashed form, so that one execution is never reachable under several
//! names. Two readings stay wider: `parse_any_case` for ids inside a declaration, whose grammar
//! takes either case (the spec compares them case-insensitively), and serde, which reads back
//! what nexus stored.

macro_rules! uuid_ids {
    ($($(#[$meta:meta])* $name:ident;)*) => {
        $(
            $(#[$meta])*
            #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
            #[serde(transparent)]
            pub struct $name(uuid::Uuid);

            impl $name {
                /// A fresh random (v4) id.
                pub fn new_v4() -> Self {
                    $name(uuid::Uuid::new_v4())
                }

                /// The id of a known UUID.
                pub const fn from_uuid(uuid: uuid::Uuid) -> Self {
                    $name(uuid)
                }

                /// The UUID underneath.
                pub const fn uuid(self) -> uuid::Uuid {
                    self.0
                }
            }

            impl From<uuid::Uuid> for $name {
                fn from(uuid: uuid::Uuid) -> Self {
                    $name(uuid)
                }
            }

            impl From<$name> for uuid::Uuid {
                fn from(id: $name) -> uuid::Uuid {
                    id.0
                }
            }

            impl std::fmt::Display for $name {
                fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    std::fmt::Display::fmt(&self.0, f)
                }
            }

            impl std::str::FromStr for $name {
                type Err = MalformedId;

                fn from_str(text: &str) -> Result<Self, Self::Err> {
                    // 36 characters of lowercase hex and dashes is the hyphenated form only.
                    if text.len() != 36 || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f' | b'-')) {
                        return Err(MalformedId);
                    }
                    uuid::Uuid::try_parse(text).map($name).map_err(|_| MalformedId)
                }
            }

            impl $name {
                /// Parses an id held in a declaration: hyphenated, in either case.
                ///
                /// # Errors
                /// [`MalformedId`] for any other text.
                pub fn parse_any_case(text: &str) -> Result<Self, MalformedId> {
                    if text.len() != 36 {
                        return Err(MalformedId);
                    }
                    uuid::Uuid::try_parse(text).map($name).map_err(|_| MalformedId)
                }
            }
        )*
    };
}

/// Text that is not an id in its one spelling, lowercase hyphenated (`docs/protocol.md`,
/// "Refusals").
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("an id is a UUID in lowercase hyphenated form, e.g. 0e5e8c4a-6f1b-4c1e-9a57-3d2b1f0c9e11")]
pub struct MalformedId;

uuid_ids! {
    /// An execution (a run): `execution_public_id`, `run_public_id`.
    ExecutionId;
    /// A runner executor: `runner_executor_public_id`, `executor_public_id`.
    RunnerId;
    /// A member (an Agent or a Human): `member_public_id`.
    MemberId;
    /// A conversation: `conversation_public_id`.
    ConversationId;
    /// An admitted input: `input_public_id`.
    InputId;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_print_parse_and_serialize_as_their_uuid() {
        let uuid = uuid::Uuid::new_v4();
        let id = ExecutionId::from_uuid(uuid);
        assert_eq!(id.to_string(), uuid.to_string());
        assert_eq!(uuid.to_string().parse::<ExecutionId>().expect("parses"), id);
        assert_eq!(serde_json::to_value(id).expect("json"), serde_json::json!(uuid.to_string()));
        assert!("not-a-uuid".parse::<RunnerId>().is_err());
        // One spelling: every other one of the same UUID is refused.
        let text = uuid.to_string();
        for other in [
            text.to_uppercase(),
            format!("{{{text}}}"),
            format!("urn:uuid:{text}"),
            uuid.simple().to_string(),
            format!(" {text}"),
            format!("{text}\n"),
        ] {
            assert_eq!(other.parse::<ExecutionId>(), Err(MalformedId), "{other}");
        }
        assert_eq!(ExecutionId::parse_any_case(&text.to_uppercase()), Ok(id), "a declaration's ids take either case");
        assert_eq!(ExecutionId::parse_any_case(&uuid.simple().to_string()), Err(MalformedId));
        assert_eq!(uuid::Uuid::from(id), uuid);
    }
}
