//! The effect-profile vocabulary (spec/REFERENCE.md section 5, "Effect profile vocabulary").

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a tool does to the world, declared by whoever serves it.
///
/// The JSON object has exactly the keys `kind`, `destructive`, `effect_scope`, `idempotency` and
/// `reconciliation`, each with a closed vocabulary. Expiry reads only [`EffectProfile::replayable`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EffectProfile {
    /// `pure | read_only | write`.
    pub kind: String,
    /// Whether the effect destroys information.
    pub destructive: bool,
    /// `closed | open`.
    pub effect_scope: String,
    /// `intrinsic | keyed | none`.
    pub idempotency: String,
    /// `none | lookup`.
    pub reconciliation: String,
}

/// The keys of an effect profile, in canonical order.
pub const EFFECT_PROFILE_KEYS: [&str; 5] = ["kind", "destructive", "effect_scope", "idempotency", "reconciliation"];

const KINDS: [&str; 3] = ["pure", "read_only", "write"];
const SCOPES: [&str; 2] = ["closed", "open"];
const IDEMPOTENCIES: [&str; 3] = ["intrinsic", "keyed", "none"];
const RECONCILIATIONS: [&str; 2] = ["none", "lookup"];

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
    /// Builds a profile from literal words; used for the catalog constants.
    pub fn new(kind: &str, destructive: bool, effect_scope: &str, idempotency: &str, reconciliation: &str) -> Self {
        EffectProfile {
            kind: kind.to_owned(),
            destructive,
            effect_scope: effect_scope.to_owned(),
            idempotency: idempotency.to_owned(),
            reconciliation: reconciliation.to_owned(),
        }
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
        let word = |key: &str, allowed: &[&str]| -> Result<String, EffectProfileError> {
            match object.get(key) {
                None => Err(fault(key, "is required")),
                Some(Value::String(s)) if allowed.contains(&s.as_str()) => Ok(s.clone()),
                Some(_) => Err(fault(key, format!("must be one of {}", allowed.join(", ")))),
            }
        };
        let kind = word("kind", &KINDS)?;
        let destructive = match object.get("destructive") {
            None => return Err(fault("destructive", "is required")),
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(fault("destructive", "must be a boolean")),
        };
        Ok(EffectProfile {
            kind,
            destructive,
            effect_scope: word("effect_scope", &SCOPES)?,
            idempotency: word("idempotency", &IDEMPOTENCIES)?,
            reconciliation: word("reconciliation", &RECONCILIATIONS)?,
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
        matches!(self.kind.as_str(), "pure" | "read_only") || self.idempotency == "intrinsic"
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
        let read = EffectProfile::new("read_only", false, "closed", "none", "none");
        let keyed_write = EffectProfile::new("write", false, "closed", "keyed", "lookup");
        let intrinsic_write = EffectProfile::new("write", true, "closed", "intrinsic", "lookup");
        assert!(read.replayable());
        assert!(!keyed_write.replayable());
        assert!(intrinsic_write.replayable());
        assert!(!EffectProfile::json_replayable(None));
        assert!(!EffectProfile::json_replayable(Some(&json!({"kind":"pure"}))));
    }
}
