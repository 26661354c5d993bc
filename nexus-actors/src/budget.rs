//! Execution budgets: the limits an input or an inline declaration sets, and the ledger an
//! execution keeps of them (`docs/executions.md`, "Budgets"; R75).
//!
//! Owns the grammar of `budget {deadline_ms?, max_model_tokens?, max_cost_usd?, max_tool_calls?,
//! max_children?}` and the ledger's arithmetic: every dimension keeps what is `reserved` (held for
//! work that is out: a model call in flight, a child's allocation) and what is `used` (known
//! usage, and the whole reservation of work whose outcome is unknown). A reservation fits when
//! `used + reserved + asked <= limit`; nothing is dispatched otherwise. No I/O here: the
//! ExecutionActor calls it ([`crate::actors::execution::budget`]) and the store keeps the ledger
//! as JSON on the execution row.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use nexus_proto::{ErrorCode, Refusal};

use crate::model::ModelPrices;

/// The longest `deadline_ms`: 30 days, in milliseconds.
pub const DEADLINE_MS_BOUND: u64 = 2_592_000_000;
/// The largest `max_model_tokens`: 10^9 tokens.
pub const MODEL_TOKENS_BOUND: u64 = 1_000_000_000;
/// The largest `max_cost_usd`: one million USD.
pub const COST_USD_BOUND: f64 = 1_000_000.0;
/// The largest `max_tool_calls`.
pub const TOOL_CALLS_BOUND: u64 = 1_000_000;
/// The largest `max_children`.
pub const CHILDREN_BOUND: u64 = 10_000;
/// The output tokens a model call is reserved when its adapter sends no output limit (an
/// `openai_compatible` provider without `max_tokens`, or `scripted`): an assumption, so such a
/// call may overrun its reservation (`docs/executions.md`, "Budgets").
pub const ASSUMED_OUTPUT_TOKENS: u64 = 4_096;
/// The fields of a budget object.
pub const BUDGET_FIELDS: [&str; 5] =
    ["deadline_ms", "max_model_tokens", "max_cost_usd", "max_tool_calls", "max_children"];

/// A budget's limits (`budget {...}`); `None` is unlimited in that dimension. Serialized with
/// every field present (`null` when unlimited).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetLimits {
    /// Milliseconds from materialization after which no model or tool call is dispatched.
    pub deadline_ms: Option<u64>,
    /// Model tokens (input plus output) over every model call.
    pub max_model_tokens: Option<u64>,
    /// Provider charges in USD, priced from the provider table.
    pub max_cost_usd: Option<f64>,
    /// Tool calls dispatched.
    pub max_tool_calls: Option<u64>,
    /// Direct children started.
    pub max_children: Option<u64>,
}

impl BudgetLimits {
    /// Reads a budget object at `field` (`budget`, or `execution_declaration.budget`).
    ///
    /// # Errors
    /// 422 `validation_failed` naming the field: not an object, an unknown key, or a value that
    /// is not a positive number within its bound (an integer for all but `max_cost_usd`).
    pub fn parse(value: &Value, field: &str) -> Result<BudgetLimits, Refusal> {
        let invalid = |detail: String| Refusal::new(ErrorCode::ValidationFailed, detail);
        let Value::Object(fields) = value else {
            return Err(invalid(format!("{field}: must be an object {{{}}}", BUDGET_FIELDS.join("?, ") + "?")));
        };
        if let Some(unknown) = fields.keys().find(|key| !BUDGET_FIELDS.contains(&key.as_str())) {
            return Err(invalid(format!(
                "{field}.{}: unknown field; a budget takes {}",
                crate::json::echo(unknown),
                BUDGET_FIELDS.join(", ")
            )));
        }
        let integer = |name: &str, bound: u64| -> Result<Option<u64>, Refusal> {
            match fields.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(value) => match value.as_u64() {
                    Some(n) if n > 0 && n <= bound => Ok(Some(n)),
                    _ => Err(invalid(format!("{field}.{name}: must be a positive integer at most {bound}"))),
                },
            }
        };
        let max_cost_usd = match fields.get("max_cost_usd") {
            None | Some(Value::Null) => None,
            Some(value) => match value.as_f64() {
                Some(usd) if usd.is_finite() && usd > 0.0 && usd <= COST_USD_BOUND => Some(usd),
                _ => {
                    return Err(invalid(format!(
                        "{field}.max_cost_usd: must be a positive number of USD at most {COST_USD_BOUND}"
                    )));
                }
            },
        };
        Ok(BudgetLimits {
            deadline_ms: integer("deadline_ms", DEADLINE_MS_BOUND)?,
            max_model_tokens: integer("max_model_tokens", MODEL_TOKENS_BOUND)?,
            max_cost_usd,
            max_tool_calls: integer("max_tool_calls", TOOL_CALLS_BOUND)?,
            max_children: integer("max_children", CHILDREN_BOUND)?,
        })
    }

    /// Whether no dimension is limited (an empty budget is no budget).
    #[must_use]
    pub fn is_unlimited(&self) -> bool {
        *self == BudgetLimits::default()
    }

    /// The smaller of each limit of `self` and `other`: how an input's budget and its inline
    /// declaration's combine (neither widens the other).
    #[must_use]
    pub fn intersect(self, other: BudgetLimits) -> BudgetLimits {
        fn least<T: PartialOrd>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(if b < a { b } else { a }),
                (a, b) => a.or(b),
            }
        }
        BudgetLimits {
            deadline_ms: least(self.deadline_ms, other.deadline_ms),
            max_model_tokens: least(self.max_model_tokens, other.max_model_tokens),
            max_cost_usd: least(self.max_cost_usd, other.max_cost_usd),
            max_tool_calls: least(self.max_tool_calls, other.max_tool_calls),
            max_children: least(self.max_children, other.max_children),
        }
    }
}

/// An amount in every dimension of a ledger: what is reserved, or used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BudgetUsage {
    /// Model tokens, input plus output.
    pub model_tokens: u64,
    /// USD of provider charges.
    pub cost_usd: f64,
    /// Tool calls.
    pub tool_calls: u64,
    /// Direct children.
    pub children: u64,
}

impl BudgetUsage {
    fn plus(self, other: BudgetUsage) -> BudgetUsage {
        BudgetUsage {
            model_tokens: self.model_tokens.saturating_add(other.model_tokens),
            cost_usd: self.cost_usd + other.cost_usd,
            tool_calls: self.tool_calls.saturating_add(other.tool_calls),
            children: self.children.saturating_add(other.children),
        }
    }

    fn minus(self, other: BudgetUsage) -> BudgetUsage {
        BudgetUsage {
            model_tokens: self.model_tokens.saturating_sub(other.model_tokens),
            cost_usd: (self.cost_usd - other.cost_usd).max(0.0),
            tool_calls: self.tool_calls.saturating_sub(other.tool_calls),
            children: self.children.saturating_sub(other.children),
        }
    }
}

/// What is left in each limited dimension (`limit - used - reserved`, never below 0); `None`
/// where the budget sets no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BudgetRemaining {
    /// Model tokens left.
    pub model_tokens: Option<u64>,
    /// USD left.
    pub cost_usd: Option<f64>,
    /// Tool calls left.
    pub tool_calls: Option<u64>,
    /// Children left.
    pub children: Option<u64>,
}

/// The model call in flight: its reservation and the prices its usage is charged at.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct InFlight {
    /// What the call holds.
    pub reserved: BudgetUsage,
    /// The model's prices, when priced.
    pub prices: Option<ModelPrices>,
}

/// An execution's budget ledger: its limits, when it started, and what is reserved and used.
/// Stored as JSON on the execution row (`executions.budget`, migration 0018) and written with
/// every save, so usage and reservations survive a restart.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BudgetLedger {
    /// The frozen limits.
    pub limits: BudgetLimits,
    /// When the deadline's clock started, Unix milliseconds on the fabric clock: the
    /// materialization, or a child's allocation ([`BudgetLedger::for_child`]).
    pub started_at: Option<i64>,
    /// Held for work that is out.
    pub reserved: BudgetUsage,
    /// Known usage, plus whole reservations of work whose outcome is unknown.
    pub used: BudgetUsage,
    /// The model call in flight, whose reservation is inside `reserved`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_call: Option<InFlight>,
    /// Each child's allocation, by the key of the call that starts it, from the call's admission
    /// until the child ended and [`BudgetLedger::settle_child`] replaced it with what it spent
    /// (`docs/delegation.md`, "Budgets"). Inside `reserved` meanwhile.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub children: std::collections::BTreeMap<String, BudgetLimits>,
}

/// What a model call is asked to reserve.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelAsk {
    /// The assembled request's estimated input tokens.
    pub input_tokens: u64,
    /// The output cap: the adapter's limit, else [`ASSUMED_OUTPUT_TOKENS`].
    pub output_tokens: u64,
    /// The model's prices, when priced.
    pub prices: Option<ModelPrices>,
}

fn exhausted(message: String) -> Refusal {
    Refusal::new(ErrorCode::BudgetExhausted, message)
}

impl BudgetLedger {
    /// A ledger of `limits` whose clock starts at materialization.
    #[must_use]
    pub fn new(limits: BudgetLimits) -> BudgetLedger {
        BudgetLedger { limits, ..BudgetLedger::default() }
    }

    /// The ledger a child execution's row is created with: its allocation
    /// ([`crate::actors::execution::budget::reserve_child`]) as limits, its deadline's clock
    /// started at `allocated_at` (Unix milliseconds), so a child never outlives its parent's
    /// deadline.
    #[must_use]
    pub fn for_child(allocation: BudgetLimits, allocated_at: i64) -> BudgetLedger {
        BudgetLedger { limits: allocation, started_at: Some(allocated_at), ..BudgetLedger::default() }
    }

    /// When the deadline passes, Unix milliseconds; `None` without one.
    #[must_use]
    pub fn deadline_at(&self) -> Option<i64> {
        let deadline = i64::try_from(self.limits.deadline_ms?).ok()?;
        Some(self.started_at?.saturating_add(deadline))
    }

    /// What an ended child charges its parent: its usage plus what it still holds (work whose
    /// outcome is unknown keeps its reservation).
    #[must_use]
    pub fn spent(&self) -> BudgetUsage {
        self.used.plus(self.reserved)
    }

    /// What is left in each limited dimension.
    #[must_use]
    pub fn remaining(&self) -> BudgetRemaining {
        let spent = self.spent();
        BudgetRemaining {
            model_tokens: self.limits.max_model_tokens.map(|max| max.saturating_sub(spent.model_tokens)),
            cost_usd: self.limits.max_cost_usd.map(|max| (max - spent.cost_usd).max(0.0)),
            tool_calls: self.limits.max_tool_calls.map(|max| max.saturating_sub(spent.tool_calls)),
            children: self.limits.max_children.map(|max| max.saturating_sub(spent.children)),
        }
    }

    /// The ledger as doors show it: `{limits, reserved, used, remaining, deadline_at}`.
    #[must_use]
    pub fn view(&self) -> Value {
        serde_json::json!({
            "limits": self.limits,
            "reserved": self.reserved,
            "used": self.used,
            "remaining": self.remaining(),
            "deadline_at": self.deadline_at(),
        })
    }

    /// Refuses any dispatch once the deadline has passed at `now` (Unix milliseconds).
    fn check_deadline(&self, now: i64, what: &str) -> Result<(), Refusal> {
        match self.deadline_at() {
            Some(deadline) if now >= deadline => Err(exhausted(format!(
                "the budget's deadline_ms of {} ms passed at {deadline} (Unix ms); {what} was not dispatched",
                self.limits.deadline_ms.unwrap_or(0)
            ))),
            _ => Ok(()),
        }
    }

    /// A restart found a model call in flight: its outcome is unknown, so its whole reservation
    /// counts as used.
    pub fn call_outcome_unknown(&mut self) {
        if let Some(call) = self.model_call.take() {
            self.reserved = self.reserved.minus(call.reserved);
            self.used = self.used.plus(call.reserved);
        }
    }

    /// Reserves a model call's worst case: `ask.input_tokens + ask.output_tokens`, priced.
    ///
    /// # Errors
    /// `budget_exhausted` past the deadline, when the tokens or the cost do not fit the
    /// remainder, or when the budget limits cost and the model has no price. Nothing is held then.
    pub fn reserve_model_call(&mut self, ask: &ModelAsk, reference: &str, now: i64) -> Result<(), Refusal> {
        // A call still held (its answer never read) ended with an unknown outcome.
        self.call_outcome_unknown();
        self.check_deadline(now, "the model call")?;
        let tokens = ask.input_tokens.saturating_add(ask.output_tokens);
        let remaining = self.remaining();
        if let Some(left) = remaining.model_tokens
            && tokens > left
        {
            return Err(exhausted(format!(
                "the next call of {reference} may use {tokens} model tokens (about {} in, up to {} out) and the \
                 budget has {left} of its max_model_tokens {} left; nothing was sent to the provider",
                ask.input_tokens,
                ask.output_tokens,
                self.limits.max_model_tokens.unwrap_or(0)
            )));
        }
        let cost = ask.prices.map_or(0.0, |p| p.cost_usd(ask.input_tokens, ask.output_tokens));
        if let Some(left) = remaining.cost_usd {
            if ask.prices.is_none() {
                return Err(exhausted(format!(
                    "the budget limits max_cost_usd but {reference} has no price; declare input_price_per_mtok and \
                     output_price_per_mtok for it in the provider table; nothing was sent to the provider"
                )));
            }
            if cost > left {
                return Err(exhausted(format!(
                    "the next call of {reference} may cost {cost:.6} USD and the budget has {left:.6} of its \
                     max_cost_usd {} left; nothing was sent to the provider",
                    self.limits.max_cost_usd.unwrap_or(0.0)
                )));
            }
        }
        let reserved = BudgetUsage { model_tokens: tokens, cost_usd: cost, ..BudgetUsage::default() };
        self.reserved = self.reserved.plus(reserved);
        self.model_call = Some(InFlight { reserved, prices: ask.prices });
        Ok(())
    }

    /// The model call answered: its real usage (`(input, output)` tokens, priced) replaces its
    /// reservation; without usage (a failure, or an answer that reports none) the whole
    /// reservation stays as used.
    pub fn settle_model_call(&mut self, usage: Option<(u64, u64)>) {
        let Some(call) = self.model_call.take() else { return };
        self.reserved = self.reserved.minus(call.reserved);
        let used = match usage {
            Some((input, output)) => BudgetUsage {
                model_tokens: input.saturating_add(output),
                cost_usd: call.prices.map_or(0.0, |p| p.cost_usd(input, output)),
                ..BudgetUsage::default()
            },
            None => call.reserved,
        };
        self.used = self.used.plus(used);
    }

    /// Reserves one tool call, which counts as used once dispatched (there is no refund).
    ///
    /// # Errors
    /// `budget_exhausted` past the deadline or when `max_tool_calls` is spent.
    pub fn reserve_tool_call(&mut self, tool: &str, now: i64) -> Result<(), Refusal> {
        self.check_deadline(now, &format!("the call of {tool}"))?;
        if self.remaining().tool_calls == Some(0) {
            return Err(exhausted(format!(
                "the budget's max_tool_calls of {} is spent; {tool} was not run; answer with what you have",
                self.limits.max_tool_calls.unwrap_or(0)
            )));
        }
        self.used.tool_calls = self.used.tool_calls.saturating_add(1);
        Ok(())
    }

    /// Reserves a child's allocation and returns it: in each limited dimension (model tokens,
    /// cost, tool calls) the `requested` limit when it fits the remainder, else (none requested)
    /// the remainder divided by the child slots left plus one (the parent's own share) when
    /// `max_children` is set, else half the remainder; unlimited dimensions stay unlimited unless requested. The deadline is the
    /// requested one, capped at the time left. A child's own `max_children` is the requested one
    /// (its children draw on its allocation). The allocation is held as reserved until
    /// [`BudgetLedger::settle_child`].
    ///
    /// # Errors
    /// `budget_exhausted` past the deadline, when `max_children` is spent, or when a requested
    /// limit exceeds the remainder. Nothing is held then.
    pub fn reserve_child(&mut self, requested: Option<&BudgetLimits>, now: i64) -> Result<BudgetLimits, Refusal> {
        self.check_deadline(now, "the child")?;
        let requested = requested.copied().unwrap_or_default();
        let remaining = self.remaining();
        if remaining.children == Some(0) {
            return Err(exhausted(format!(
                "the budget's max_children of {} is spent; the child was not started",
                self.limits.max_children.unwrap_or(0)
            )));
        }
        // The parent keeps a share for its own calls: the remainder is divided among the child
        // slots left and the parent itself, or halved without `max_children`.
        let slots = remaining.children.map_or(2, |left| left.saturating_add(1)).max(1);
        let share_u = |left: u64| left / slots;
        let share_f = |left: f64| left / slots as f64;
        let over = |name: &str, asked: String, left: String| {
            exhausted(format!(
                "the child asks {name} {asked} and the budget has {left} left; the child was not started"
            ))
        };
        let pick_u = |name: &str, asked: Option<u64>, left: Option<u64>| match (asked, left) {
            (Some(asked), Some(left)) if asked > left => Err(over(name, asked.to_string(), left.to_string())),
            (Some(asked), _) => Ok(Some(asked)),
            (None, left) => Ok(left.map(share_u)),
        };
        let max_model_tokens = pick_u("max_model_tokens", requested.max_model_tokens, remaining.model_tokens)?;
        let max_tool_calls = pick_u("max_tool_calls", requested.max_tool_calls, remaining.tool_calls)?;
        let max_cost_usd = match (requested.max_cost_usd, remaining.cost_usd) {
            (Some(asked), Some(left)) if asked > left => {
                return Err(over("max_cost_usd", format!("{asked:.6}"), format!("{left:.6}")));
            }
            (Some(asked), _) => Some(asked),
            (None, left) => left.map(share_f),
        };
        let time_left = self.deadline_at().map(|at| u64::try_from(at.saturating_sub(now)).unwrap_or(0));
        let deadline_ms = match (requested.deadline_ms, time_left) {
            (Some(asked), Some(left)) => Some(asked.min(left)),
            (asked, left) => asked.or(left),
        };
        let allocation = BudgetLimits {
            deadline_ms,
            max_model_tokens,
            max_cost_usd,
            max_tool_calls,
            max_children: requested.max_children,
        };
        // A share too small to do anything is no allocation: the child is refused rather than
        // started with nothing (`docs/delegation.md`, "Budgets").
        if let Some(name) = [("max_model_tokens", max_model_tokens), ("max_tool_calls", max_tool_calls)]
            .iter()
            .find_map(|(name, limit)| (*limit == Some(0)).then_some(*name))
            .or_else(|| max_cost_usd.is_some_and(|c| c <= 0.0).then_some("max_cost_usd"))
        {
            return Err(exhausted(format!(
                "the budget's remaining {name} is too small to share with another child; the child was not started"
            )));
        }
        self.reserved = self.reserved.plus(exposure(&allocation));
        Ok(allocation)
    }

    /// A child ended: what it `spent` ([`BudgetLedger::spent`] of its ledger) replaces its
    /// `allocation` in what this ledger holds, and the child counts as used.
    pub fn settle_child(&mut self, allocation: &BudgetLimits, spent: &BudgetUsage) {
        self.reserved = self.reserved.minus(exposure(allocation));
        let spent = BudgetUsage { children: 1, ..*spent };
        self.used = self.used.plus(spent);
    }

    /// The limits of work that may spend nothing more: each dimension this ledger limits at 0
    /// (and a deadline already past); the unlimited ones stay unlimited.
    #[must_use]
    pub fn exhausted_limits(&self) -> BudgetLimits {
        BudgetLimits {
            deadline_ms: self.limits.deadline_ms.map(|_| 0),
            max_model_tokens: self.limits.max_model_tokens.map(|_| 0),
            max_cost_usd: self.limits.max_cost_usd.map(|_| 0.0),
            max_tool_calls: self.limits.max_tool_calls.map(|_| 0),
            max_children: self.limits.max_children.map(|_| 0),
        }
    }

    /// A child's allocation that no child will use (its call was refused, denied, or its turn
    /// ended first) is given back whole.
    pub fn release_child(&mut self, allocation: &BudgetLimits) {
        self.reserved = self.reserved.minus(exposure(allocation));
    }
}

/// What an allocation holds of its parent: its limited dimensions, and one child.
fn exposure(allocation: &BudgetLimits) -> BudgetUsage {
    BudgetUsage {
        model_tokens: allocation.max_model_tokens.unwrap_or(0),
        cost_usd: allocation.max_cost_usd.unwrap_or(0.0),
        tool_calls: allocation.max_tool_calls.unwrap_or(0),
        children: 1,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_grammar_refuses_what_it_does_not_take() {
        let cases = [
            ("not_an_object", json!(5)),
            ("unknown_key", json!({"max_tokens": 5})),
            ("negative", json!({"max_model_tokens": -1})),
            ("zero", json!({"max_tool_calls": 0})),
            ("fraction_of_an_integer", json!({"max_tool_calls": 1.5})),
            ("over_bound", json!({"deadline_ms": DEADLINE_MS_BOUND + 1})),
            ("string", json!({"max_children": "2"})),
            ("zero_cost", json!({"max_cost_usd": 0})),
            ("cost_over_bound", json!({"max_cost_usd": 2e6})),
        ];
        for (name, value) in cases {
            let refusal = BudgetLimits::parse(&value, "budget").expect_err(name);
            assert_eq!(refusal.code, ErrorCode::ValidationFailed, "{name}");
            assert!(refusal.message.starts_with("budget"), "{name}: {}", refusal.message);
        }
        let limits = BudgetLimits::parse(&json!({"max_cost_usd": 0.5, "max_tool_calls": 3, "deadline_ms": null}), "b")
            .expect("valid");
        assert_eq!(
            limits,
            BudgetLimits { max_cost_usd: Some(0.5), max_tool_calls: Some(3), ..BudgetLimits::default() }
        );
    }

    #[test]
    fn intersect_takes_the_smaller_of_each() {
        let a = BudgetLimits { max_model_tokens: Some(100), max_tool_calls: Some(5), ..BudgetLimits::default() };
        let b = BudgetLimits { max_model_tokens: Some(50), max_cost_usd: Some(1.0), ..BudgetLimits::default() };
        let both = a.intersect(b);
        assert_eq!(both.max_model_tokens, Some(50));
        assert_eq!(both.max_tool_calls, Some(5));
        assert_eq!(both.max_cost_usd, Some(1.0));
        assert_eq!(both.deadline_ms, None);
    }

    #[test]
    fn a_model_call_reserves_its_worst_case_and_usage_replaces_it() {
        let mut ledger = BudgetLedger::new(BudgetLimits { max_model_tokens: Some(1_000), ..BudgetLimits::default() });
        ledger.started_at = Some(0);
        let ask = ModelAsk { input_tokens: 300, output_tokens: 200, prices: None };
        ledger.reserve_model_call(&ask, "p/m", 1).expect("fits");
        assert_eq!(ledger.reserved.model_tokens, 500);
        ledger.settle_model_call(Some((250, 50)));
        assert_eq!((ledger.reserved.model_tokens, ledger.used.model_tokens), (0, 300));
        // 700 left: a 500 ask fits, then an unknown outcome keeps it all.
        ledger.reserve_model_call(&ask, "p/m", 2).expect("fits");
        ledger.settle_model_call(None);
        assert_eq!(ledger.used.model_tokens, 800);
        let refused = ledger.reserve_model_call(&ask, "p/m", 3).expect_err("200 left");
        assert_eq!(refused.code, ErrorCode::BudgetExhausted);
        assert_eq!(ledger.reserved, BudgetUsage::default(), "a refusal holds nothing");
    }

    #[test]
    fn cost_needs_a_price_and_must_fit() {
        let mut ledger = BudgetLedger::new(BudgetLimits { max_cost_usd: Some(0.01), ..BudgetLimits::default() });
        let unpriced = ModelAsk { input_tokens: 10, output_tokens: 10, prices: None };
        assert_eq!(
            ledger.reserve_model_call(&unpriced, "p/m", 0).expect_err("unpriced").code,
            ErrorCode::BudgetExhausted
        );
        let prices = Some(ModelPrices { input_per_mtok: 1.0, output_per_mtok: 4.0 });
        // 1000 in + 1000 out = 0.001 + 0.004 USD.
        let priced = ModelAsk { input_tokens: 1_000, output_tokens: 1_000, prices };
        ledger.reserve_model_call(&priced, "p/m", 0).expect("fits");
        assert!((ledger.reserved.cost_usd - 0.005).abs() < 1e-12);
        ledger.settle_model_call(Some((1_000, 0)));
        assert!((ledger.used.cost_usd - 0.001).abs() < 1e-12);
        let big = ModelAsk { input_tokens: 10_000, output_tokens: 0, prices };
        assert!(ledger.reserve_model_call(&big, "p/m", 0).is_err(), "0.01 > 0.009 left");
    }

    #[test]
    fn tool_calls_and_the_deadline() {
        let mut ledger = BudgetLedger::new(BudgetLimits {
            max_tool_calls: Some(1),
            deadline_ms: Some(100),
            ..BudgetLimits::default()
        });
        ledger.started_at = Some(1_000);
        ledger.reserve_tool_call("t", 1_050).expect("one call");
        assert_eq!(ledger.reserve_tool_call("t", 1_050).expect_err("spent").code, ErrorCode::BudgetExhausted);
        let mut late = BudgetLedger::new(BudgetLimits { deadline_ms: Some(100), ..BudgetLimits::default() });
        late.started_at = Some(1_000);
        late.reserve_tool_call("t", 1_099).expect("before the deadline");
        assert!(late.reserve_tool_call("t", 1_100).is_err(), "at the deadline");
    }

    /// R75: whatever the children ask, in whatever order, what they hold and spent never adds up
    /// past the parent's limit, in any dimension.
    #[test]
    fn children_never_add_up_past_the_parent() {
        let asks: [Option<BudgetLimits>; 6] = [
            None,
            Some(BudgetLimits { max_model_tokens: Some(400), ..BudgetLimits::default() }),
            Some(BudgetLimits { max_model_tokens: Some(10_000), ..BudgetLimits::default() }),
            Some(BudgetLimits { max_cost_usd: Some(0.3), max_tool_calls: Some(2), ..BudgetLimits::default() }),
            Some(BudgetLimits { max_tool_calls: Some(50), ..BudgetLimits::default() }),
            Some(BudgetLimits::default()),
        ];
        for max_children in [None, Some(1), Some(3), Some(8)] {
            for seed in 0..64_u64 {
                let limits = BudgetLimits {
                    max_model_tokens: Some(1_000),
                    max_cost_usd: Some(1.0),
                    max_tool_calls: Some(10),
                    max_children,
                    deadline_ms: Some(10_000),
                };
                let mut parent = BudgetLedger::new(limits);
                parent.started_at = Some(0);
                let mut live: Vec<BudgetLimits> = Vec::new();
                let mut state = seed;
                for step in 0..24 {
                    state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    let pick = usize::try_from(state >> 33).unwrap_or(0);
                    if pick % 3 == 0 && !live.is_empty() {
                        let allocation = live.remove(pick % live.len());
                        // A child spends some of what it was given, never more.
                        let spent = BudgetUsage {
                            model_tokens: allocation.max_model_tokens.unwrap_or(0) / 2,
                            cost_usd: allocation.max_cost_usd.unwrap_or(0.0) / 3.0,
                            tool_calls: allocation.max_tool_calls.unwrap_or(0),
                            children: 0,
                        };
                        parent.settle_child(&allocation, &spent);
                    } else if let Ok(allocation) = parent.reserve_child(asks[pick % asks.len()].as_ref(), step) {
                        assert!(allocation.deadline_ms.is_some_and(|d| d <= 10_000));
                        live.push(allocation);
                    }
                    let spent = parent.spent();
                    assert!(spent.model_tokens <= 1_000, "seed {seed}: {spent:?}");
                    assert!(spent.cost_usd <= 1.0 + 1e-9, "seed {seed}: {spent:?}");
                    assert!(spent.tool_calls <= 10, "seed {seed}: {spent:?}");
                    if let Some(max) = max_children {
                        assert!(spent.children <= max, "seed {seed}: {spent:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_child_gets_a_share_or_what_it_asks() {
        let mut parent = BudgetLedger::new(BudgetLimits {
            max_model_tokens: Some(900),
            max_children: Some(3),
            ..BudgetLimits::default()
        });
        let first = parent.reserve_child(None, 0).expect("a slot");
        assert_eq!(first.max_model_tokens, Some(225), "900 over 3 slots and the parent's share");
        assert_eq!(first.max_tool_calls, None, "unlimited stays unlimited");
        let asked = BudgetLimits { max_model_tokens: Some(700), ..BudgetLimits::default() };
        assert!(parent.reserve_child(Some(&asked), 0).is_err(), "700 > 675 left");
        let second = parent.reserve_child(None, 0).expect("a slot");
        assert_eq!(second.max_model_tokens, Some(225), "675 over 2 slots and the parent's share");
        parent.settle_child(&first, &BudgetUsage { model_tokens: 100, ..BudgetUsage::default() });
        assert_eq!(parent.remaining().model_tokens, Some(575));
        assert_eq!(parent.remaining().children, Some(1));
        let unlimited = BudgetLedger::new(BudgetLimits { max_tool_calls: Some(4), ..BudgetLimits::default() })
            .reserve_child(None, 0)
            .expect("no max_children");
        assert_eq!(unlimited.max_tool_calls, Some(2), "half the remainder");
    }

    #[test]
    fn a_share_that_rounds_to_nothing_is_refused() {
        let mut parent = BudgetLedger::new(BudgetLimits {
            max_tool_calls: Some(2),
            max_children: Some(3),
            ..BudgetLimits::default()
        });
        let refused = parent.reserve_child(None, 0).expect_err("2 calls over 3 slots and the parent's share is 0");
        assert_eq!(refused.code, ErrorCode::BudgetExhausted);
        assert_eq!(parent.reserved, BudgetUsage::default(), "nothing is held");
        let exhausted = parent.exhausted_limits();
        assert_eq!((exhausted.max_tool_calls, exhausted.max_model_tokens), (Some(0), None));
    }
}
