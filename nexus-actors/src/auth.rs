//! Bearer credentials and their two planes (`docs/protocol.md`, "Credentials and planes").
//!
//! A member-plane credential opens the profile and execution doors; an executor-transport
//! credential opens only the runner stream. Each plane's doors refuse the other's credential with
//! 401 `unauthorized`, with the message an unknown token gets: no answer tells a token that opens
//! some other door from a guess. Tokens are shown once at minting and stored only as SHA-256
//! digests. Failed attempts are throttled per source ([`throttle`]).

pub mod throttle;

use rand::RngCore;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use nexus_proto::{ErrorCode, Refusal};

/// The plane a credential belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plane {
    /// Members (agents and humans): the profile, input and execution doors.
    Member,
    /// Executors (runners): the runner stream only.
    ExecutorTransport,
}

impl Plane {
    /// The stored word: `member` or `executor_transport`.
    pub fn as_str(self) -> &'static str {
        match self {
            Plane::Member => "member",
            Plane::ExecutorTransport => "executor_transport",
        }
    }

    /// Parses the stored word.
    pub fn from_word(word: &str) -> Option<Plane> {
        match word {
            "member" => Some(Plane::Member),
            "executor_transport" => Some(Plane::ExecutorTransport),
            _ => None,
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Plane::Member => "sk-nexus-api-v1-",
            Plane::ExecutorTransport => "sk-nexus-runner-v1-",
        }
    }
}

/// A credential ready to store: its digest, plane and subject. The token itself is never stored;
/// [`Store::authenticate`](crate::store::Store::authenticate) checks a presented one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credential {
    /// SHA-256 hex of the token.
    pub digest: String,
    /// The plane it opens.
    pub plane: Plane,
    /// The member or executor it authenticates.
    pub subject: Uuid,
}

/// SHA-256 hex of a token (credentials and claim tokens alike).
pub fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A fresh random token with 256 bits of entropy, as lowercase hex.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// Mints a token for `subject` on `plane`. Returns the token (show it once) and its credential.
pub fn mint(plane: Plane, subject: Uuid) -> (String, Credential) {
    let token = format!("{}{}", plane.prefix(), random_token());
    let credential = Credential { digest: digest(&token), plane, subject };
    (token, credential)
}

/// The one refusal of a credential that does not open a door of `plane`, whatever the reason
/// (unknown, expired, revoked, of the other plane, its member gone): 401 `unauthorized`, with a
/// message that names only the door's plane.
pub fn not_accepted(plane: Plane) -> Refusal {
    let what = match plane {
        Plane::Member => "a member credential (`nexus admin member create` mints one)",
        Plane::ExecutorTransport => "a runner credential (`nexus admin runner create` mints one)",
    };
    Refusal::new(ErrorCode::Unauthorized, format!("this credential is not accepted here; these doors take {what}"))
}

/// Extracts the token from a request's `Authorization` values (HTTP headers or gRPC metadata
/// entries, `None` for a value that is not visible ASCII): exactly one must be sent.
///
/// # Errors
/// `unauthorized` when there is none, more than one (which one would count is ambiguous), or it
/// is not a bearer.
pub fn bearer_of<'a>(values: impl IntoIterator<Item = Option<&'a str>>) -> Result<&'a str, Refusal> {
    let mut values = values.into_iter();
    let first = values.next();
    let more = values.count();
    if more > 0 {
        return Err(Refusal::new(
            ErrorCode::Unauthorized,
            format!("the request carries {} Authorization headers; send exactly one", more + 1),
        ));
    }
    bearer(first.flatten())
}

/// Extracts the token from an `Authorization: Bearer <token>` header value.
///
/// # Errors
/// `unauthorized` when the header is missing or not a bearer.
pub fn bearer(header: Option<&str>) -> Result<&str, Refusal> {
    header
        .and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Refusal::new(ErrorCode::Unauthorized, "send `Authorization: Bearer <token>`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_tokens_differ_by_plane_and_hash_stably() {
        let subject = Uuid::new_v4();
        let (member_token, member) = mint(Plane::Member, subject);
        let (runner_token, runner) = mint(Plane::ExecutorTransport, subject);
        assert!(member_token.starts_with("sk-nexus-api-v1-"));
        assert!(runner_token.starts_with("sk-nexus-runner-v1-"));
        assert_eq!(member.digest, digest(&member_token));
        assert_ne!(member.digest, runner.digest);
        assert_eq!(member.digest.len(), 64);
        assert!(!member.digest.contains(&member_token));
    }

    #[test]
    fn bearer_header_parsing() {
        assert_eq!(bearer(Some("Bearer abc")).ok(), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")).map_err(|r| r.code).err(), Some(ErrorCode::Unauthorized));
        assert!(bearer(None).is_err());
        assert_eq!(bearer_of([Some("Bearer abc")]).ok(), Some("abc"));
        for refused in [vec![], vec![None], vec![Some("Bearer abc"), Some("Bearer abc")], vec![Some("Bearer a"), None]]
        {
            assert_eq!(
                bearer_of(refused.clone()).map_err(|r| r.code).err(),
                Some(ErrorCode::Unauthorized),
                "{refused:?}"
            );
        }
    }
}
