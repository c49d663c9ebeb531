//! `transaction`: a list of actions done all or nothing, as QEMU's `qmp_transaction`
//! (`blockdev.c`) does them, with the arguments of `qapi/transaction.json` (`actions`, each
//! `{"type", "data"}`; `properties.completion-mode`) and QEMU's texts.
//!
//! This module owns the command's arguments and the order of prepare and commit (the
//! staged effects and their three-step commit are `staged.rs`'); each bitmap action's arguments and checks are `bitmaps`'
//! (the same ones its command makes).
//!
//! * **Prepared, then committed.** Each action in turn is prepared: its checks made (seeing
//!   the actions before it), its effect staged, nothing changed, but for a bitmap to remove
//!   being held busy (QEMU holds it so until the commit). The first action that fails ends
//!   the transaction with its error; dropping what was staged is the abort (the holds let
//!   go), so every earlier action is undone by never having been applied: no bitmap was
//!   added, none cleared, enabled, disabled or merged into. When all are prepared, the commit
//!   applies every effect; nothing in it is refused (the checks were made, and nothing else
//!   changes bitmaps while the monitor runs the command).
//! * **Actions served:** the six `block-dirty-bitmap-*`, `blockdev-backup` and `abort`
//!   (always refused, with QEMU's text). A backup is prepared with every check its command
//!   makes (seeing a bitmap an earlier action adds) and started after the bitmaps' commit,
//!   so it takes its bitmap as the actions left it (libvirt's checkpoint and backup in one
//!   transaction). The other types QEMU knows (snapshots, `drive-backup`) are refused as not
//!   served here; a type QEMU does not know gets QEMU's text for it. `completion-mode=grouped` is
//!   refused for any action but a backup, as QEMU refuses it.
//! * **No write missed, without a drain.** QEMU drains every node before the actions
//!   (`bdrv_drain_all`), so no write completes while they run. This daemon has no drain
//!   across iothreads: a write dirties the recording bitmaps on its export's iothread when it
//!   completes (`aio_block`'s request filter). So the commit runs on the monitor thread in
//!   three steps: (1) the bitmaps added are added and those enabled start recording;
//!   (2) the clears and merges run, in the actions' order; (3) those disabled stop recording
//!   and those removed go. Each change is one step under the bitmap's own lock or atomics,
//!   and the end state is the one QEMU's order gives (a bitmap's last enable or disable
//!   wins). A write completing during the commit lands in every bitmap recording before and
//!   after; in the ones recording only after (step 1 came first) or in the ones recording
//!   only before (step 3 has not come yet), and so in at least one side: libvirt's checkpoint
//!   (a new bitmap added, the previous one disabled) loses no write, at worst one is in
//!   both, which a dirty bitmap allows (a bit says "may have changed").

use serde_json::{json, Value};

use super::bitmaps::{refused, BitmapAction};
use super::commands::{Command, State};
use super::staged::Staged;
use super::wire::{Args, QmpError};

/// The command this module serves.
pub(super) const COMMANDS: &[Command] = &[Command {
    name: "transaction",
    run: |state, _, args| state.transaction(args),
}];

/// Every action type of QEMU 10.0's `TransactionAction`.
const KINDS: &[&str] = &[
    "abort",
    "block-dirty-bitmap-add",
    "block-dirty-bitmap-remove",
    "block-dirty-bitmap-clear",
    "block-dirty-bitmap-enable",
    "block-dirty-bitmap-disable",
    "block-dirty-bitmap-merge",
    "blockdev-backup",
    "blockdev-snapshot",
    "blockdev-snapshot-internal-sync",
    "blockdev-snapshot-sync",
    "drive-backup",
];

/// The actions `completion-mode=grouped` allows (QEMU's: the backups').
const GROUPED: &[&str] = &["blockdev-backup", "drive-backup"];

/// One action of a transaction, parsed.
enum Action {
    /// A dirty bitmap action.
    Bitmap(BitmapAction),
    /// `blockdev-backup`, its arguments read when it is prepared (after the actions before
    /// it).
    Backup(Args),
    /// `abort`: always refused.
    Abort,
    /// An action QEMU knows that this daemon does not serve yet.
    NotServed(&'static str),
}

impl State {
    /// `transaction actions [properties]`.
    fn transaction(&mut self, mut args: Args) -> Result<Value, QmpError> {
        // QEMU reads every argument before any action runs.
        let items = args.array("actions")?;
        let mut actions = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            let at = args.path(&format!("actions[{i}]"));
            let Value::Object(members) = item else {
                return Err(QmpError::generic(format!(
                    "Invalid parameter type for '{at}', expected: object"
                )));
            };
            let mut member = Args::nested(members, at);
            let kind = member
                .opt_enum("type", KINDS)?
                .ok_or_else(|| member.missing("type"))?;
            let data = member
                .opt_object("data")?
                .ok_or_else(|| member.missing("data"))?;
            let data = Args::nested(data, member.path("data"));
            let action = match kind {
                "abort" => {
                    data.finish()?;
                    Action::Abort
                }
                k if BitmapAction::KINDS.contains(&k) => {
                    Action::Bitmap(BitmapAction::parse(k, data)?)
                }
                "blockdev-backup" => Action::Backup(data),
                // Its arguments are not read: the action is refused whatever they are.
                other => Action::NotServed(other),
            };
            member.finish()?;
            actions.push((kind, action));
        }
        let mode = match args.opt_object("properties")? {
            Some(members) => {
                let mut properties = Args::nested(members, args.path("properties"));
                let mode = properties.opt_enum("completion-mode", &["individual", "grouped"])?;
                properties.finish()?;
                mode.unwrap_or("individual")
            }
            None => "individual",
        };
        args.finish()?;
        if mode != "individual" {
            if let Some((kind, _)) = actions.iter().find(|(k, _)| !GROUPED.contains(k)) {
                return Err(QmpError::generic(format!(
                    "Action '{kind}' does not support transaction property completion-mode = \
                     {mode}"
                )));
            }
        }

        let mut staged = Staged::default();
        let mut backups = Vec::new();
        for (_, action) in actions {
            match action {
                Action::Bitmap(action) => self.prepare_bitmap(&mut staged, action)?,
                Action::Backup(args) => backups.push(self.prepare_backup(&staged, args)?),
                Action::Abort => {
                    return Err(QmpError::generic("Transaction aborted using Abort action"))
                }
                Action::NotServed(kind) => {
                    return Err(QmpError::generic(format!(
                        "Action '{kind}' is not served in a transaction by aio-storage-daemon \
                         yet"
                    )))
                }
            }
        }
        staged.commit().map_err(refused)?;
        // After the bitmaps' changes: a backup takes its bitmap as the actions left it.
        for backup in backups {
            self.start_backup(backup)?;
        }
        Ok(json!({}))
    }
}
