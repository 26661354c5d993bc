//! Id newtypes: one type per kind of public id, each a UUID underneath, so an execution's id can
//! never be passed where a runner's is expected. They print and parse as the UUID's hyphenated
//! text and serialize as that string.

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
                type Err = uuid::Error;

                fn from_str(text: &str) -> Result<Self, Self::Err> {
                    uuid::Uuid::parse_str(text).map($name)
                }
            }
        )*
    };
}

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
        assert_eq!(uuid::Uuid::from(id), uuid);
    }
}
