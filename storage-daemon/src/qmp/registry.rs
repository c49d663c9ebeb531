//! Every QMP command served, each name written once: the lists of the modules that serve them
//! joined, in `query-commands`' order, and a request run by the one its name finds.
//!
//! This module owns the lookup and the two commands about commands (`qmp_capabilities` once
//! negotiated, `query-commands`); what each command does is its module's.

use serde_json::{json, Value};

use super::commands::{self, Command, Ctx, State};
use super::wire::{Args, QmpError, Request};
use super::{active, backup, bitmaps, create, iothreads, jobs, nbd, resize, stats, transaction};

/// The commands about commands.
const SESSION: &[Command] = &[
    Command {
        name: "qmp_capabilities",
        run: |_, _, _| {
            Err(QmpError::command_not_found(
                "Capabilities negotiation is already complete, command ignored",
            ))
        },
    },
    Command {
        name: "query-commands",
        run: |_, _, args| {
            args.finish()?;
            Ok(Value::Array(
                all().map(|c| json!({ "name": c.name })).collect(),
            ))
        },
    },
];

/// Each module's commands, in `query-commands`' order.
const LISTS: &[&[Command]] = &[
    SESSION,
    commands::COMMANDS,
    iothreads::COMMANDS,
    stats::COMMANDS,
    resize::COMMANDS,
    active::COMMANDS,
    nbd::COMMANDS,
    bitmaps::COMMANDS,
    transaction::COMMANDS,
    create::COMMANDS,
    jobs::COMMANDS,
    backup::COMMANDS,
];

/// Every command served.
pub(super) fn all() -> impl Iterator<Item = &'static Command> {
    LISTS.iter().flat_map(|list| list.iter())
}

/// Runs `request` (after capabilities negotiation) on `state`.
pub(super) fn execute(state: &mut State, ctx: &Ctx, request: Request) -> Result<Value, QmpError> {
    let Some(command) = all().find(|c| c.name == request.execute) else {
        return Err(QmpError::command_not_found(format!(
            "The command {} has not been found",
            request.execute
        )));
    };
    (command.run)(state, ctx, Args::new(request.arguments))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_is_served_once() {
        let mut names: Vec<&str> = all().map(|c| c.name).collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "a command listed twice");
        for name in ["qmp_capabilities", "query-commands", "blockdev-add", "quit"] {
            assert!(names.contains(&name), "{name}");
        }
    }
}
