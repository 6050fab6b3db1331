//! A mount's push of the changes it made in its private directories
//! (`docs/fs.md`, "Private directories"): ordered as one update, each
//! change made as its maker and at its time, as the mount made it in its
//! own copy.
//!
//! Each change is made as its maker squashed, as any caller is (root is
//! `nobody` unless the service allows root).
//!
//! Who may push what: every directory whose names a push changes, and
//! every inode whose attributes it changes, is one the push makes or one
//! the pusher holds `Write` on.  Nobody else can then hold a token on any
//! of them, so a push recalls nothing and notifies nobody: it is answered
//! as soon as it is durable, even while a recall of the pusher's token is
//! out (the push is how the pusher answers it).  The pusher gets `Write`
//! on every inode the push made.

use crate::op::{self, Failure, Grant, Reply};
use crate::private::check_push;
use crate::tokens::{Level, Want};
use crate::update::{Answer, Pushed, Update, UpdateOp};

use super::decide::granted;
use super::{Outcome, Shell, Soft, fs};

impl<H> Soft<H> {
    pub(super) fn push(
        &mut self,
        shell: &mut impl Shell,
        req: &op::Request,
        ops: &[Pushed],
    ) -> Outcome {
        let client = req.session;
        if !self.tokens.knows(client) {
            return Outcome::Reply(Err(Failure::NoSession));
        }
        // A push applied already (its answer lost, with the primary that
        // gave it) is answered again as it was, whatever its pusher holds
        // now: a directory it removed could not be reclaimed.
        let applied = shell.read(|t| t.recorded(client.pushes(), req.seq).is_some());
        let holds = |ino| applied || self.tokens.level(client, ino) == Level::Write;
        // Each change is made as its maker, squashed as a request's caller
        // is: a push is no way round root squash.
        let ops: Vec<Pushed> = ops
            .iter()
            .map(|p| Pushed {
                who: self.squash(p.who.clone()),
                ..p.clone()
            })
            .collect();
        let made = match check_push(&ops, holds) {
            Ok(made) => made,
            Err(e) => return Outcome::Reply(Err(fs(e))),
        };
        // The push has its own exactly-once record, apart from the
        // session's other changes (it comes from its own caller, with its
        // own request numbers): sessions are odd, so the even number next
        // to it is nobody else's.
        let update = Update {
            session: client.pushes(),
            seq: req.seq,
            who: req.who.clone(),
            now: shell.wall(),
            op: UpdateOp::Push { ops },
        };
        let results = match shell.order(&update) {
            Ok(Ok(Answer::Pushed(results))) => results,
            Ok(Ok(other)) => {
                return Outcome::Reply(Err(Failure::Unavailable(format!(
                    "a push answered {other:?}"
                ))));
            }
            Ok(Err(e)) => return Outcome::Reply(Err(fs(e))),
            Err(e) => return Outcome::Reply(Err(e)),
        };
        // An inode that went with its last name, which only the pusher
        // could hold: its token goes with it (the mount drops its own).
        for res in &results {
            if let Ok(Answer::Removed {
                gone: Some(ino), ..
            }) = res
            {
                self.tokens.forget(*ino);
            }
        }
        let attrs: Vec<_> = shell.read(|t| {
            made.iter()
                .filter_map(|ino| t.get(*ino).map(|i| i.attr))
                .collect()
        });
        let made = attrs
            .into_iter()
            .filter_map(|attr| {
                // Answered again, a push gives the grants it gave: its
                // first answer may be the one the mount sees.
                if applied && self.tokens.level(client, attr.ino) == Level::Write {
                    let grant = self.tokens.grant_of(client, attr.ino);
                    return Some((
                        attr,
                        Grant {
                            level: Level::Write,
                            grant,
                            uncached: false,
                        },
                    ));
                }
                let d = self
                    .tokens
                    .request(client, attr.ino, Want::Change, &[], None);
                granted(&d).map(|g| (attr, g))
            })
            .collect();
        Outcome::Reply(Ok(Reply::Pushed { results, made }))
    }
}
