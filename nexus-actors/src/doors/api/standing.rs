//! The one authorization rule of the execution doors (`docs/executions.md`, "People in the
//! loop"): what the caller may do with an Agent's executions, conversations, inputs, tasks and
//! events. Every execution door on HTTP and gRPC asks it through [`Api::execution_for`] or
//! [`Api::task_for`] (a conversation door through [`Api::conversation_for`]); input admission asks
//! it through [`Api::answering_agent`]; the listing doors take [`agents_readable_by`].
//!
//! The rule, in the order a door applies it:
//! 1. an unknown id answers 404 `not_found`;
//! 2. the caller's [`Standing`] toward the Agent that owns it: [`Standing::Owner`] (the Agent
//!    itself), [`Standing::Steward`] or [`Standing::Viewer`] (a Human holding that grant, read
//!    afresh on every request, so a revoke takes effect on the next one), else [`Standing::None`];
//! 3. a read ([`Need::Read`]) needs any standing but `None`, an act ([`Need::Act`]) needs `Owner`
//!    or `Steward`. An Agent without standing is answered exactly as for an unknown id (404
//!    `not_found`, the same message: Agents learn nothing of one another's ids); a Human without
//!    enough standing gets 403 `not_authorized`, saying which grant would open the door;
//! 4. then the door's own checks: a suspended member starts nothing (403 `not_authorized`, the
//!    [`super::Caller::require_active`] pattern), and the state words (409).

use nexus_proto::{ConversationId, ErrorCode, ExecutionId, GrantRole, MemberId, MemberKind, Refusal, TaskKey};

use super::{Api, Caller, internal};
use crate::store::{ExecutionRow, MemberRow, Store, TaskRow};

/// The caller's standing toward one Agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// The Agent itself.
    Owner,
    /// A Human holding a `steward` grant on the Agent.
    Steward,
    /// A Human holding a `viewer` grant on the Agent.
    Viewer,
    /// Anyone else: another Agent, or a Human without a grant.
    None,
}

impl Standing {
    /// The standing of `caller` toward `agent`, given the grant `caller` holds on it (read by
    /// [`standing`]; ignored unless `caller` is a Human).
    pub fn of(caller: &MemberRow, agent: MemberId, grant: Option<GrantRole>) -> Standing {
        if caller.public_id == agent {
            return Standing::Owner;
        }
        match (caller.kind, grant) {
            (MemberKind::Human, Some(GrantRole::Steward)) => Standing::Steward,
            (MemberKind::Human, Some(GrantRole::Viewer)) => Standing::Viewer,
            _ => Standing::None,
        }
    }

    /// Whether this standing may do what `need` asks.
    pub const fn allows(self, need: Need) -> bool {
        match self {
            Standing::Owner | Standing::Steward => true,
            Standing::Viewer => matches!(need, Need::Read),
            Standing::None => false,
        }
    }
}

/// What a door does with an Agent's execution, conversation or input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Reads it: the execution, its tasks, its events (pages, SSE, gRPC `StreamEvents`), a
    /// conversation.
    Read,
    /// Acts on it: posts an input, approves, denies, retries, abandons, pauses, resumes, stops,
    /// regenerates, compacts, estimates.
    Act,
}

/// The caller's standing toward `agent`: one grant read for a Human, none for an Agent.
///
/// # Errors
/// `internal` on a store failure.
pub async fn standing(store: &Store, caller: &MemberRow, agent: MemberId) -> Result<Standing, Refusal> {
    if caller.public_id == agent || caller.kind != MemberKind::Human {
        return Ok(Standing::of(caller, agent, None));
    }
    let grant = store.grant_role(agent, caller.public_id).await.map_err(internal)?;
    Ok(Standing::of(caller, agent, grant))
}

/// Judges `standing` for `need` (rule 3 of the module): `Ok` when it allows it; else `missing()`
/// for an Agent caller (as for an unknown id), and 403 `not_authorized` for a Human, where `what`
/// names the thing ("execution 0192…", "conversation 0192…").
///
/// # Errors
/// As above.
pub fn judge(
    caller: &MemberRow,
    standing: Standing,
    need: Need,
    what: &str,
    missing: impl FnOnce() -> Refusal,
) -> Result<(), Refusal> {
    if standing.allows(need) {
        return Ok(());
    }
    if caller.kind != MemberKind::Human {
        return Err(missing());
    }
    let message = match standing {
        Standing::Viewer => format!(
            "you are a viewer of {what}: you may read it, not act on it; an operator makes you \
             a steward with `nexus admin member grant --human ID --agent ID --role steward`"
        ),
        _ => format!(
            "you hold no grant for {what}; an operator grants one with \
             `nexus admin member grant --human ID --agent ID --role viewer|steward`"
        ),
    };
    Err(Refusal::new(ErrorCode::NotAuthorized, message))
}

/// The Agents whose executions and conversations `caller` may read, for the listing doors: the
/// Agent itself for an Agent; the Agents a Human stewards or views (ordered by id).
///
/// # Errors
/// `internal` on a store failure.
pub async fn agents_readable_by(store: &Store, caller: &MemberRow) -> Result<Vec<MemberId>, Refusal> {
    match caller.kind {
        MemberKind::Agent => Ok(vec![caller.public_id]),
        MemberKind::Human => {
            let grants = store.grants_of(caller.public_id).await.map_err(internal)?;
            Ok(grants.into_iter().map(|grant| grant.agent_public_id).collect())
        }
    }
}

impl Api {
    /// The stored execution `id`, when `caller`'s standing toward its Agent allows `need` (the
    /// module's rule).
    ///
    /// # Errors
    /// 404 `not_found` for an unknown execution and, with the same message, for another Agent's;
    /// 403 `not_authorized` for a Human without the grant `need` takes; `internal` on a store
    /// failure.
    pub async fn execution_for(&self, caller: &Caller, id: ExecutionId, need: Need) -> Result<ExecutionRow, Refusal> {
        let missing = || Refusal::new(ErrorCode::NotFound, format!("no execution {id}"));
        let row = self.fabric.store.execution(id).await.map_err(internal)?.ok_or_else(missing)?;
        let standing = standing(&self.fabric.store, &caller.member, row.member_public_id).await?;
        judge(&caller.member, standing, need, &format!("the Agent that owns execution {id}"), missing)?;
        Ok(row)
    }

    /// The stored execution `id` and its task `task_key`, judged as [`Api::execution_for`]; an
    /// unknown task (or a key in none of the task-key grammars) answers 404 `not_found` once the
    /// caller's standing is settled, so a Human without it learns nothing of the tasks.
    ///
    /// # Errors
    /// As [`Api::execution_for`], and 404 `not_found` for an unknown task.
    pub async fn task_for(
        &self,
        caller: &Caller,
        id: ExecutionId,
        task_key: &str,
        need: Need,
    ) -> Result<(ExecutionRow, TaskRow), Refusal> {
        let row = self.execution_for(caller, id, need).await?;
        let missing = || Refusal::new(ErrorCode::NotFound, format!("no task {task_key} in execution {id}"));
        let key: TaskKey = task_key.parse().map_err(|_| missing())?;
        let task = self.fabric.store.task(id, key).await.map_err(internal)?.ok_or_else(missing)?;
        Ok((row, task))
    }

    /// The Agent that owns conversation `id`, when `caller`'s standing toward it allows `need`:
    /// for the conversation doors, and for an input continuing it ([`Need::Act`]).
    ///
    /// # Errors
    /// 404 `not_found` for an unknown conversation and, with the same message, for another
    /// Agent's; 403 `not_authorized` for a Human without the grant `need` takes; `internal` on a
    /// store failure.
    pub async fn conversation_for(&self, caller: &Caller, id: ConversationId, need: Need) -> Result<MemberId, Refusal> {
        let store = &self.fabric.store;
        let missing = || Refusal::new(ErrorCode::NotFound, format!("no conversation {id}"));
        let agent = store.conversation_agent(id).await.map_err(internal)?.ok_or_else(missing)?;
        let standing = standing(store, &caller.member, agent).await?;
        judge(&caller.member, standing, need, &format!("the Agent that owns conversation {id}"), missing)?;
        Ok(agent)
    }

    /// The Agent that answers an input `caller` posts (`docs/executions.md`, "People in the
    /// loop"): a continued conversation's owner, which the caller must be or steward; for a new
    /// conversation, the caller itself when it is an Agent (it may name only itself in
    /// `agent_public_id`), or the Agent a Human names in `agent_public_id` and stewards.
    ///
    /// # Errors
    /// 404 `not_found` for an unknown conversation or Agent, and for an Agent caller naming
    /// another Agent's conversation or another Agent; 403 `not_authorized` for a Human who does
    /// not steward the Agent; 400 `parameter_missing` when a Human starts a conversation without
    /// `agent_public_id`; 422 `validation_failed` when `agent_public_id` names another Agent than
    /// the continued conversation's.
    pub async fn answering_agent(
        &self,
        caller: &Caller,
        conversation: Option<ConversationId>,
        named: Option<MemberId>,
    ) -> Result<MemberId, Refusal> {
        let store = &self.fabric.store;
        if let Some(id) = conversation {
            let agent = self.conversation_for(caller, id, Need::Act).await?;
            if named.is_some_and(|named| named != agent) {
                return Err(Refusal::new(
                    ErrorCode::ValidationFailed,
                    format!(
                        "agent_public_id: conversation {id} is answered by its own Agent ({agent}); omit \
                         agent_public_id to continue it, or start a new conversation for another Agent"
                    ),
                ));
            }
            return Ok(agent);
        }
        let me = caller.member.public_id;
        match (caller.member.kind, named) {
            (MemberKind::Agent, None) => Ok(me),
            (MemberKind::Agent, Some(named)) if named == me => Ok(me),
            // As an unknown one: an Agent learns nothing of other Agents' ids.
            (MemberKind::Agent, Some(named)) => Err(Refusal::new(
                ErrorCode::NotFound,
                format!("no Agent {named} answers your inputs; an Agent posts to itself: omit agent_public_id"),
            )),
            (MemberKind::Human, None) => Err(Refusal::new(
                ErrorCode::ParameterMissing,
                "agent_public_id is required: a Human posts for an Agent it stewards; name that Agent \
                 (or continue one of its conversations with conversation_public_id)",
            )),
            (MemberKind::Human, Some(agent)) => {
                let missing = || Refusal::new(ErrorCode::NotFound, format!("no Agent {agent}"));
                let member = store.member(agent).await.map_err(internal)?;
                if member.is_none_or(|member| member.kind != MemberKind::Agent) {
                    return Err(missing());
                }
                let standing = standing(store, &caller.member, agent).await?;
                judge(&caller.member, standing, Need::Act, &format!("Agent {agent}"), missing)?;
                Ok(agent)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use nexus_proto::MemberStatus;

    use super::*;

    fn member(kind: MemberKind) -> MemberRow {
        MemberRow {
            public_id: MemberId::new_v4(),
            kind,
            handle: "someone".into(),
            display_name: "someone".into(),
            status: MemberStatus::Active,
        }
    }

    fn code(result: Result<(), Refusal>) -> Option<ErrorCode> {
        result.err().map(|refusal| refusal.code)
    }

    /// `(caller, the grant it holds on the Agent, its standing, the read answer, the act answer)`.
    type Row<'a> = (&'a MemberRow, Option<GrantRole>, Standing, Option<ErrorCode>, Option<ErrorCode>);

    #[test]
    fn one_table_of_who_may_read_and_act() {
        let agent = member(MemberKind::Agent);
        let other_agent = member(MemberKind::Agent);
        let human = member(MemberKind::Human);
        let missing = || Refusal::new(ErrorCode::NotFound, "no execution");
        let rows: Vec<Row<'_>> = vec![
            (&agent, None, Standing::Owner, None, None),
            // A grant means nothing to an Agent caller: it is always 404.
            (&other_agent, None, Standing::None, Some(ErrorCode::NotFound), Some(ErrorCode::NotFound)),
            (
                &other_agent,
                Some(GrantRole::Steward),
                Standing::None,
                Some(ErrorCode::NotFound),
                Some(ErrorCode::NotFound),
            ),
            (&human, Some(GrantRole::Steward), Standing::Steward, None, None),
            (&human, Some(GrantRole::Viewer), Standing::Viewer, None, Some(ErrorCode::NotAuthorized)),
            (&human, None, Standing::None, Some(ErrorCode::NotAuthorized), Some(ErrorCode::NotAuthorized)),
        ];
        for (caller, grant, want, read, act) in rows {
            let standing = Standing::of(caller, agent.public_id, grant);
            assert_eq!(standing, want, "{:?} with {grant:?}", caller.kind);
            assert_eq!(code(judge(caller, standing, Need::Read, "execution x", missing)), read, "{want:?} reads");
            assert_eq!(code(judge(caller, standing, Need::Act, "execution x", missing)), act, "{want:?} acts");
        }
    }
}
