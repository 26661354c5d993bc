//! A conversation's line of executions, and its `steer` inputs (`docs/executions.md`,
//! "Conversations: one turn at a time").
//!
//! One execution runs per conversation at a time: the executions of a conversation that have not
//! ended form its line, in the order of their inputs' turns. An admitted input's execution waits
//! (`pending`, never materialized) while one before it in the line is live. A `steer` input posted
//! while the line is not empty has no execution of its own: the live execution applies it at its
//! next boundary (it is `applied`), or it becomes a turn of its own (`turn`) when no live
//! execution can apply it any more, or it is `canceled`. What a conversation holds is all in its
//! rows: the hand-off from an ended execution to the next one reads it, and so does recovery.

use std::sync::Arc;

use sqlx::{AnyConnection, Row};

use nexus_proto::{ConversationId, DeliveryMode, ExecutionId, InputId, RunStatus, SteerOutcome};

use super::executions::{admit_delivered_in, save_execution_in};
use super::{EventRow, ExecutionRow, InputRow, Store, StoreResult, parse, parse_opt};

/// The most inputs one conversation holds waiting (`input_queue_full` beyond it): queued turns
/// that wait for an execution before them, and steers not yet applied (REFERENCE 7, "Input
/// queue 16").
pub const INPUT_QUEUE_BOUND: usize = 16;

/// One execution of a conversation that has not ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveExecution {
    /// The execution.
    pub public_id: ExecutionId,
    /// Its input.
    pub input_public_id: InputId,
    /// Its input's turn.
    pub turn: i64,
    /// Its status.
    pub status: RunStatus,
    /// Admitted and never materialized: it waits for its turn (a regeneration, created with its
    /// declaration and its first event, never waits).
    pub waiting: bool,
}

impl LiveExecution {
    /// It has materialized (or is a regeneration): it can reach a boundary and apply a steer.
    pub fn is_started(&self) -> bool {
        !self.waiting
    }
}

/// A `steer` input not applied, not a turn, not canceled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitingSteer {
    /// The input.
    pub input_public_id: InputId,
    /// Its turn.
    pub turn: i64,
    /// Its text.
    pub text: String,
}

/// How an input was admitted ([`Store::admit_to_conversation`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Refused, nothing written: the conversation already holds [`INPUT_QUEUE_BOUND`] waiting
    /// inputs.
    Full {
        /// How many wait.
        waiting: usize,
    },
    /// A turn of its own with a pending execution.
    Turn {
        /// Its execution.
        execution: ExecutionId,
        /// Its turn.
        turn: i64,
        /// The live executions before it, in order: empty when it may start now.
        ahead: Vec<LiveExecution>,
    },
    /// A turn of its own with a pending execution, held out of the conversation's line until
    /// `deliver_at` (`docs/executions.md`, "Scheduled inputs"): the caller arms its delivery
    /// ([`crate::actors::root::RootHandle::schedule_delivery`]).
    Scheduled {
        /// Its execution.
        execution: ExecutionId,
        /// Its turn at admission; it takes the conversation's next turn when it is delivered.
        turn: i64,
        /// When it is delivered, in Unix milliseconds.
        deliver_at: i64,
    },
    /// A steer recorded for the conversation's live execution to apply.
    Steer {
        /// Its turn.
        turn: i64,
        /// The first live execution of the conversation, the one expected to apply it.
        into: LiveExecution,
    },
}

/// What the store holds of an input's delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// `queue` or `steer`.
    pub mode: DeliveryMode,
    /// What became of a steer; `None` while it waits to be applied (and for a `queue` input).
    pub outcome: Option<SteerOutcome>,
    /// The execution that applied it, once `applied`.
    pub applied_execution_public_id: Option<ExecutionId>,
    /// The round at whose boundary it was applied.
    pub applied_round: Option<i64>,
}

fn waiting_count(line: &[LiveExecution], steers: usize) -> usize {
    // The first of the line runs (or is about to); every waiting one after it waits.
    line.iter().skip(1).filter(|e| e.waiting).count() + steers
}

async fn line_in(connection: &mut AnyConnection, conversation: ConversationId) -> StoreResult<Vec<LiveExecution>> {
    let rows = sqlx::query(
        "SELECT e.public_id, e.input_public_id, e.status, e.event_seq, i.turn FROM executions e \
         JOIN inputs i ON i.public_id = e.input_public_id \
         WHERE e.conversation_public_id = $1 AND e.status NOT IN ('completed', 'canceled') \
         AND (i.deliver_at IS NULL OR i.delivered_at IS NOT NULL) \
         ORDER BY i.turn, e.created_at, e.public_id",
    )
    .bind(conversation.to_string())
    .fetch_all(&mut *connection)
    .await?;
    rows.iter()
        .map(|row| {
            let status: RunStatus = parse(&row.try_get::<String, _>("status")?)?;
            let event_seq: i64 = row.try_get("event_seq")?;
            Ok(LiveExecution {
                public_id: parse(&row.try_get::<String, _>("public_id")?)?,
                input_public_id: parse(&row.try_get::<String, _>("input_public_id")?)?,
                turn: row.try_get("turn")?,
                status,
                waiting: status == RunStatus::Pending && event_seq == 0,
            })
        })
        .collect()
}

async fn steers_in(connection: &mut AnyConnection, conversation: ConversationId) -> StoreResult<Vec<WaitingSteer>> {
    let rows = sqlx::query(
        "SELECT public_id, turn, text FROM inputs WHERE conversation_public_id = $1 AND delivery_mode = 'steer' \
         AND steer_outcome IS NULL ORDER BY turn",
    )
    .bind(conversation.to_string())
    .fetch_all(&mut *connection)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(WaitingSteer {
                input_public_id: parse(&row.try_get::<String, _>("public_id")?)?,
                turn: row.try_get("turn")?,
                text: row.try_get("text")?,
            })
        })
        .collect()
}

/// How many inputs of `conversation` are held for a later delivery with their execution still
/// waiting (a canceled one no longer waits).
async fn held_in(connection: &mut AnyConnection, conversation: ConversationId) -> StoreResult<usize> {
    let held: i64 = sqlx::query(
        "SELECT COUNT(*) AS held FROM inputs i JOIN executions e ON e.input_public_id = i.public_id \
         WHERE i.conversation_public_id = $1 AND i.deliver_at IS NOT NULL AND i.delivered_at IS NULL \
         AND e.status = 'pending'",
    )
    .bind(conversation.to_string())
    .fetch_one(&mut *connection)
    .await?
    .try_get("held")?;
    Ok(usize::try_from(held).unwrap_or(usize::MAX))
}

/// Whether `input` is held: admitted with a `deliver_at` still to come, and not delivered.
fn held_at(input: &InputRow, now: i64) -> Option<i64> {
    input.deliver_at.filter(|at| *at > now)
}

/// Marks the `applied` steers (each with its round) applied by `execution`, on the writer's
/// transaction (a compare-and-set from unapplied each).
pub(super) async fn mark_applied(
    connection: &mut AnyConnection,
    applied: &[(InputId, i64)],
    execution: ExecutionId,
) -> StoreResult<()> {
    for (input, round) in applied {
        sqlx::query(
            "UPDATE inputs SET steer_outcome = 'applied', applied_execution_public_id = $2, applied_round = $3 \
             WHERE public_id = $1 AND steer_outcome IS NULL",
        )
        .bind(input.to_string())
        .bind(execution.to_string())
        .bind(*round)
        .execute(&mut *connection)
        .await?;
    }
    Ok(())
}

impl Store {
    /// Admits an input delivered as `mode` in one transaction, after counting what its
    /// conversation holds waiting: refused ([`Admission::Full`], nothing written) at
    /// [`INPUT_QUEUE_BOUND`]; an input whose [`InputRow::deliver_at`] is still to come is held out
    /// of the line with its pending execution `execution` ([`Admission::Scheduled`]; as a queued
    /// turn whatever `mode` says: [`crate::schedule::delivery_time`] refuses a scheduled steer);
    /// a `steer` while the conversation has a live execution is recorded for it to apply
    /// ([`Admission::Steer`]); anything else is a turn with the pending execution `execution`
    /// ([`Admission::Turn`]). Held inputs count toward the bound: each waits, and delivery only
    /// moves it into the line.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure; nothing is written then.
    pub async fn admit_to_conversation(
        &self,
        input: &InputRow,
        new_conversation: bool,
        mode: DeliveryMode,
        execution: ExecutionId,
    ) -> StoreResult<Admission> {
        let input = Arc::new(input.clone());
        let now = self.clock.now_ms();
        self.writer
            .write(move |connection| {
                let input = input.clone();
                Box::pin(async move {
                    let conversation = input.conversation_public_id;
                    let (line, steers, held) = match new_conversation {
                        true => (Vec::new(), Vec::new(), 0),
                        false => (
                            line_in(connection, conversation).await?,
                            steers_in(connection, conversation).await?,
                            held_in(connection, conversation).await?,
                        ),
                    };
                    let scheduled = held_at(&input, now);
                    // Behind a live execution the input waits, as every unapplied steer, every
                    // queued turn after the running one and every held input does; a held input
                    // waits whatever the line holds.
                    let waiting = waiting_count(&line, steers.len()) + held;
                    if (!line.is_empty() || scheduled.is_some()) && waiting >= INPUT_QUEUE_BOUND {
                        return Ok(Admission::Full { waiting });
                    }
                    let mode = if scheduled.is_some() { DeliveryMode::Queue } else { mode };
                    let into = line.first().copied();
                    let own = match (mode, into) {
                        (DeliveryMode::Steer, Some(_)) => None,
                        _ => Some(execution),
                    };
                    admit_delivered_in(connection, &input, new_conversation, own, mode, now).await?;
                    let turn: i64 = sqlx::query("SELECT turn FROM inputs WHERE public_id = $1")
                        .bind(input.public_id.to_string())
                        .fetch_one(&mut *connection)
                        .await?
                        .try_get("turn")?;
                    Ok(match (scheduled, own, into) {
                        (Some(deliver_at), _, _) => Admission::Scheduled { execution, turn, deliver_at },
                        (None, None, Some(into)) => Admission::Steer { turn, into },
                        _ => Admission::Turn { execution, turn, ahead: line },
                    })
                })
            })
            .await
    }

    /// Delivers the held input `input` now (`docs/executions.md`, "Scheduled inputs"): it joins
    /// its conversation's line as its next turn (its turn number is kept when it is the last
    /// already). A compare-and-set, from held and its execution still waiting: answers the
    /// conversation to hand off, or `None`, writing nothing, when the input is not held any more
    /// (delivered already, or canceled).
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure; nothing is written then.
    pub async fn deliver_scheduled(&self, input: InputId) -> StoreResult<Option<ConversationId>> {
        let now = self.clock.now_ms();
        self.writer
            .write(move |connection| {
                Box::pin(async move {
                    let Some(row) = sqlx::query("SELECT conversation_public_id FROM inputs WHERE public_id = $1")
                        .bind(input.to_string())
                        .fetch_optional(&mut *connection)
                        .await?
                    else {
                        return Ok(None);
                    };
                    let conversation: ConversationId = parse(&row.try_get::<String, _>("conversation_public_id")?)?;
                    let delivered = sqlx::query(
                        "UPDATE inputs SET delivered_at = $2, turn = CASE \
                           WHEN turn = (SELECT MAX(l.turn) FROM inputs l WHERE l.conversation_public_id = $3) THEN turn \
                           ELSE (SELECT MAX(l.turn) FROM inputs l WHERE l.conversation_public_id = $3) + 1 END \
                         WHERE public_id = $1 AND deliver_at IS NOT NULL AND delivered_at IS NULL \
                         AND EXISTS (SELECT 1 FROM executions e WHERE e.input_public_id = $1 \
                           AND e.status = 'pending' AND e.event_seq = 0)",
                    )
                    .bind(input.to_string())
                    .bind(now)
                    .bind(conversation.to_string())
                    .execute(&mut *connection)
                    .await?
                    .rows_affected();
                    Ok((delivered > 0).then_some(conversation))
                })
            })
            .await
    }

    /// The held inputs whose execution still waits, each with its `deliver_at` (Unix ms), soonest
    /// first: recovery re-arms a timer for each.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn held_inputs(&self) -> StoreResult<Vec<(InputId, i64)>> {
        let rows = sqlx::query(
            "SELECT i.public_id, i.deliver_at FROM inputs i JOIN executions e ON e.input_public_id = i.public_id \
             WHERE i.deliver_at IS NOT NULL AND i.delivered_at IS NULL AND e.status = 'pending' \
             ORDER BY i.deliver_at, i.public_id",
        )
        .fetch_all(self.reader())
        .await?;
        rows.iter()
            .map(|row| Ok((parse(&row.try_get::<String, _>("public_id")?)?, row.try_get("deliver_at")?)))
            .collect()
    }

    /// When the held `input` is to be delivered (Unix ms), or `None` when it is not held (never
    /// scheduled, or delivered).
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn held_until(&self, input: InputId) -> StoreResult<Option<i64>> {
        let row = sqlx::query(
            "SELECT deliver_at FROM inputs WHERE public_id = $1 AND deliver_at IS NOT NULL AND delivered_at IS NULL",
        )
        .bind(input.to_string())
        .fetch_optional(self.reader())
        .await?;
        row.map(|row| row.try_get("deliver_at")).transpose().map_err(Into::into)
    }

    /// The executions of `conversation` that have not ended, in turn order.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn conversation_line(&self, conversation: ConversationId) -> StoreResult<Vec<LiveExecution>> {
        let mut connection = self.reader().acquire().await?;
        line_in(&mut connection, conversation).await
    }

    /// The `steer` inputs of `conversation` that wait to be applied, in turn order.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn waiting_steers(&self, conversation: ConversationId) -> StoreResult<Vec<WaitingSteer>> {
        let mut connection = self.reader().acquire().await?;
        steers_in(&mut connection, conversation).await
    }

    /// The conversations holding steers that wait to be applied (for recovery).
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn conversations_with_waiting_steers(&self) -> StoreResult<Vec<ConversationId>> {
        let rows = sqlx::query(
            "SELECT DISTINCT conversation_public_id FROM inputs WHERE delivery_mode = 'steer' AND steer_outcome IS NULL",
        )
        .fetch_all(self.reader())
        .await?;
        rows.iter().map(|r| parse(&r.try_get::<String, _>("conversation_public_id")?)).collect()
    }

    /// How an input was delivered and what became of it; `None` for an unknown input.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn delivery(&self, input: InputId) -> StoreResult<Option<Delivery>> {
        let row = sqlx::query(
            "SELECT delivery_mode, steer_outcome, applied_execution_public_id, applied_round FROM inputs \
             WHERE public_id = $1",
        )
        .bind(input.to_string())
        .fetch_optional(self.reader())
        .await?;
        row.map(|row| {
            Ok(Delivery {
                mode: parse(&row.try_get::<String, _>("delivery_mode")?)?,
                outcome: parse_opt(row.try_get("steer_outcome")?)?,
                applied_execution_public_id: parse_opt(row.try_get("applied_execution_public_id")?)?,
                applied_round: row.try_get("applied_round")?,
            })
        })
        .transpose()
    }

    /// The first execution of an input (the one its admission created, not a regeneration).
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn first_execution_of(&self, input: InputId) -> StoreResult<Option<ExecutionId>> {
        let row = sqlx::query(
            "SELECT public_id FROM executions WHERE input_public_id = $1 ORDER BY created_at, event_seq LIMIT 1",
        )
        .bind(input.to_string())
        .fetch_optional(self.reader())
        .await?;
        row.map(|r| parse(&r.try_get::<String, _>("public_id")?)).transpose()
    }

    /// Disposes of a waiting steer as `outcome` (`turn` or `canceled`) by creating its execution
    /// `execution` (pending, or already `canceled`) with `events`, in one transaction. A
    /// compare-and-set: answers `false`, writing nothing, when the steer was disposed of already.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure; nothing is written then.
    pub async fn dispose_steer(
        &self,
        outcome: SteerOutcome,
        execution: &ExecutionRow,
        events: &[EventRow],
    ) -> StoreResult<bool> {
        let write = Arc::new((execution.clone(), events.to_vec()));
        self.writer
            .write(move |connection| {
                let write = write.clone();
                Box::pin(async move {
                    let (execution, events) = &*write;
                    let taken = sqlx::query(
                        "UPDATE inputs SET steer_outcome = $2 WHERE public_id = $1 AND delivery_mode = 'steer' \
                         AND steer_outcome IS NULL",
                    )
                    .bind(execution.input_public_id.to_string())
                    .bind(outcome.as_str())
                    .execute(&mut *connection)
                    .await?
                    .rows_affected();
                    if taken == 0 {
                        return Ok(false);
                    }
                    super::executions::insert_execution_in(connection, execution).await?;
                    if !events.is_empty() || execution.error_key.is_some() {
                        save_execution_in(connection, execution, None, &[], events, execution.updated_at).await?;
                    }
                    Ok(true)
                })
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(turn: i64, waiting: bool) -> LiveExecution {
        LiveExecution {
            public_id: ExecutionId::new_v4(),
            input_public_id: InputId::new_v4(),
            turn,
            status: if waiting { RunStatus::Pending } else { RunStatus::Running },
            waiting,
        }
    }

    #[test]
    fn the_running_turn_never_counts_as_waiting() {
        assert_eq!(waiting_count(&[], 0), 0);
        assert_eq!(waiting_count(&[live(1, false)], 0), 0);
        // Just admitted and about to start: the head of the line does not wait.
        assert_eq!(waiting_count(&[live(1, true)], 0), 0);
        assert_eq!(waiting_count(&[live(1, false), live(2, true), live(3, true)], 2), 4);
    }
}
