//! The effect-profile vocabulary (`docs/declaration.md`, "Kernel imports"; `docs/protocol.md`,
//! "Announce" and "Expiry").

use serde::{Deserialize, Serialize};
use serde_json::Value;

nexus_proto::words! {
    /// What a tool's effect is.
    pub enum EffectKind("effect kind") {
        /// No effect at all.
        Pure => "pure",
        /// Reads the world, changes nothing.
        ReadOnly => "read_only",
        /// Changes the world.
        Write => "write",
    }
}

nexus_proto::words! {
    /// How far an effect reaches.
    pub enum EffectScope("effect scope") {
        /// Inside what the tool owns.
        Closed => "closed",
        /// Beyond it.
        Open => "open",
    }
}

nexus_proto::words! {
    /// Whether doing it twice is the same as once.
    pub enum Idempotency("idempotency") {
        /// By its nature.
        Intrinsic => "intrinsic",
        /// Under a key the caller supplies.
        Keyed => "keyed",
        /// Not at all.
        None => "none",
    }
}

nexus_proto::words! {
    /// Whether an effect that may have happened can be looked up afterwards.
    pub enum Reconciliation("reconciliation") {
        /// It cannot.
        None => "none",
        /// It can.
        Lookup => "lookup",
    }
}

/// What a tool does to the world, declared by whoever serves it.
///
/// The JSON object has exactly the keys `kind`, `destructive`, `effect_scope`, `idempotency` and
/// `reconciliation`, each with a closed vocabulary. Expiry reads only [`EffectProfile::replayable`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EffectProfile {
    /// `pure | read_only | write`.
    pub kind: EffectKind,
    /// Whether the effect destroys information.
    pub destructive: bool,
    /// `closed | open`.
    pub effect_scope: EffectScope,
    /// `intrinsic | keyed | none`.
    pub idempotency: Idempotency,
    /// `none | lookup`.
    pub reconciliation: Reconciliation,
}

/// The keys of an effect profile, in canonical order.
pub const EFFECT_PROFILE_KEYS: [&str; 5] = ["kind", "destructive", "effect_scope", "idempotency", "reconciliation"];

/// Why a JSON value is not an effect profile. `field` is the offending key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("effect_profile{}: {reason}", field.as_ref().map(|f| format!(".{f}")).unwrap_or_default())]
pub struct EffectProfileError {
    /// The key at fault, when one is.
    pub field: Option<String>,
    /// What is wrong and what is allowed.
    pub reason: String,
}

fn fault(field: &str, reason: impl Into<String>) -> EffectProfileError {
    EffectProfileError { field: Some(field.to_owned()), reason: reason.into() }
}

impl EffectProfile {
    /// Builds a profile; used for the catalog constants.
    pub const fn new(
        kind: EffectKind,
        destructive: bool,
        effect_scope: EffectScope,
        idempotency: Idempotency,
        reconciliation: Reconciliation,
    ) -> Self {
        EffectProfile { kind, destructive, effect_scope, idempotency, reconciliation }
    }

    /// Parses and validates: exactly the five keys, each value in its closed vocabulary.
    ///
    /// # Errors
    /// [`EffectProfileError`] naming the first missing, unknown or out-of-vocabulary key.
    pub fn from_json(value: &Value) -> Result<Self, EffectProfileError> {
        let Some(object) = value.as_object() else {
            return Err(EffectProfileError { field: None, reason: "must be an object".into() });
        };
        if let Some(extra) = object.keys().find(|k| !EFFECT_PROFILE_KEYS.contains(&k.as_str())) {
            return Err(fault(extra, "is not an effect profile key"));
        }
        fn word<T: Copy + std::fmt::Display + std::str::FromStr>(
            object: &serde_json::Map<String, Value>,
            key: &str,
            all: &[T],
        ) -> Result<T, EffectProfileError> {
            let allowed = || all.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
            match object.get(key) {
                None => Err(fault(key, "is required")),
                Some(Value::String(s)) => s.parse().map_err(|_| fault(key, format!("must be one of {}", allowed()))),
                Some(_) => Err(fault(key, format!("must be one of {}", allowed()))),
            }
        }
        let kind = word(object, "kind", EffectKind::ALL)?;
        let destructive = match object.get("destructive") {
            None => return Err(fault("destructive", "is required")),
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(fault("destructive", "must be a boolean")),
        };
        Ok(EffectProfile {
            kind,
            destructive,
            effect_scope: word(object, "effect_scope", EffectScope::ALL)?,
            idempotency: word(object, "idempotency", Idempotency::ALL)?,
            reconciliation: word(object, "reconciliation", Reconciliation::ALL)?,
        })
    }

    /// The profile as its canonical JSON object (exactly the five keys).
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "kind": self.kind,
            "destructive": self.destructive,
            "effect_scope": self.effect_scope,
            "idempotency": self.idempotency,
            "reconciliation": self.reconciliation,
        })
    }

    /// Replayable iff the kind is `pure` or `read_only`, or the idempotency is `intrinsic`.
    pub fn replayable(&self) -> bool {
        matches!(self.kind, EffectKind::Pure | EffectKind::ReadOnly) || self.idempotency == Idempotency::Intrinsic
    }

    /// Replayability of a stored JSON profile: a missing or malformed profile is not replayable.
    pub fn json_replayable(value: Option<&Value>) -> bool {
        value.and_then(|v| EffectProfile::from_json(v).ok()).is_some_and(|p| p.replayable())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn exactly_five_keys_with_closed_values() {
        let good = json!({"kind":"write","destructive":true,"effect_scope":"open",
            "idempotency":"none","reconciliation":"none"});
        let profile = EffectProfile::from_json(&good).expect("valid");
        assert!(!profile.replayable());
        assert_eq!(profile.to_json(), good);

        let mut extra = good.clone();
        extra["world"] = json!("open");
        assert_eq!(EffectProfile::from_json(&extra).unwrap_err().field.as_deref(), Some("world"));

        let mut missing = good.clone();
        missing.as_object_mut().map(|o| o.remove("reconciliation"));
        let err = EffectProfile::from_json(&missing).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("reconciliation"));

        let mut bad = good;
        bad["kind"] = json!("delete");
        assert_eq!(EffectProfile::from_json(&bad).unwrap_err().field.as_deref(), Some("kind"));
    }

    #[test]
    fn replayability_rule() {
        use super::{EffectKind as K, EffectScope as S, Idempotency as I, Reconciliation as R};
        let read = EffectProfile::new(K::ReadOnly, false, S::Closed, I::None, R::None);
        let keyed_write = EffectProfile::new(K::Write, false, S::Closed, I::Keyed, R::Lookup);
        let intrinsic_write = EffectProfile::new(K::Write, true, S::Closed, I::Intrinsic, R::Lookup);
        assert!(read.replayable());
        assert!(!keyed_write.replayable());
        assert!(intrinsic_write.replayable());
        assert!(!EffectProfile::json_replayable(None));
        assert!(!EffectProfile::json_replayable(Some(&json!({"kind":"pure"}))));
    }
}
