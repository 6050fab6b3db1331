//! Replies and callbacks on the wire: `encode_reply`, `decode_reply`.

use super::*;

fn callback(w: &mut Writer, c: &Callback) {
    match c {
        Callback::Recall { ino, to, grant } => {
            w.u8(1);
            w.u64(ino.0);
            level(w, *to);
            w.u64(*grant);
        }
        Callback::StopCaching { ino, grant } => {
            w.u8(2);
            w.u64(ino.0);
            w.u64(*grant);
        }
        Callback::Orphan { ino } => {
            w.u8(4);
            w.u64(ino.0);
        }
        Callback::Notice { id, dir, name } => {
            w.u8(3);
            w.u64(*id);
            w.u64(dir.0);
            w.str16(name);
        }
        Callback::Unlocked { ino } => {
            w.u8(5);
            w.u64(ino.0);
        }
    }
}

fn read_callback(r: &mut Reader) -> Result<Callback, DecodeError> {
    Ok(match r.u8()? {
        1 => Callback::Recall {
            ino: Ino(r.u64()?),
            to: read_level(r)?,
            grant: r.u64()?,
        },
        2 => Callback::StopCaching {
            ino: Ino(r.u64()?),
            grant: r.u64()?,
        },
        4 => Callback::Orphan { ino: Ino(r.u64()?) },
        5 => Callback::Unlocked { ino: Ino(r.u64()?) },
        3 => Callback::Notice {
            id: r.u64()?,
            dir: Ino(r.u64()?),
            name: r.str16()?.to_vec(),
        },
        _ => return Err(bad("fs reply", "unknown callback")),
    })
}

/// A reply's bytes: status 1 (0 a reply, 1 a file system error and its
/// errno 2, 2 no session, 3 not the primary, 4 unavailable and why), then
/// for 0 a kind 1 and its fields.
pub fn encode_reply(reply: &Result<Reply, Failure>) -> Vec<u8> {
    let mut out = Vec::new();
    let w = &mut Writer(&mut out);
    let reply = match reply {
        Ok(r) => r,
        Err(Failure::Fs(e)) => {
            w.u8(1);
            w.u16(e.errno() as u16);
            return out;
        }
        Err(Failure::NoSession) => {
            w.u8(2);
            return out;
        }
        Err(Failure::NotPrimary) => {
            w.u8(3);
            return out;
        }
        Err(Failure::Unavailable(why)) => {
            w.u8(4);
            w.text16(why, u16::MAX as usize);
            return out;
        }
    };
    w.u8(0);
    match reply {
        Reply::Hello {
            lease_ms,
            root,
            servers,
            copies,
        } => {
            w.u8(1);
            w.u32(*lease_ms);
            write_attr(w, root);
            w.u32(servers.len() as u32);
            for c in servers {
                w.cap(c);
            }
            w.u8(*copies);
        }
        Reply::Events(list) => {
            w.u8(2);
            w.u32(list.len() as u32);
            for c in list {
                callback(w, c);
            }
        }
        Reply::Entry { attr, grant: g } => {
            w.u8(3);
            write_attr(w, attr);
            grant(w, g);
        }
        Reply::Entries { entries, grant: g } => {
            w.u8(4);
            w.u32(entries.len() as u32);
            for e in entries {
                w.str16(&e.name);
                w.u64(e.ino.0);
                w.u8(e.kind as u8);
            }
            grant(w, g);
        }
        Reply::Target(t) => {
            w.u8(5);
            w.str16(t);
        }
        Reply::Opened {
            attr,
            grant: g,
            content,
        } => {
            w.u8(6);
            write_attr(w, attr);
            grant(w, g);
            w.u32(content.len() as u32);
            for c in content {
                w.cap(c);
            }
        }
        Reply::Data(d) => {
            w.u8(7);
            w.bytes32(d);
        }
        Reply::Updated(res) => {
            w.u8(8);
            write_result(w, res);
        }
        Reply::StatFs(s) => {
            w.u8(9);
            w.u32(s.block_size);
            w.u64(s.blocks);
            w.u64(s.blocks_free);
            w.u64(s.files);
            w.u64(s.files_free);
        }
        Reply::Status(s) => {
            w.u8(10);
            w.bytes32(s.as_bytes());
        }
        Reply::Done => w.u8(11),
        Reply::Changed {
            result,
            dirs,
            opened,
            secret,
        } => {
            w.u8(13);
            write_result(w, result);
            w.u32(dirs.len() as u32);
            for a in dirs {
                write_attr(w, a);
            }
            opt(w, *opened, |w, g| grant(w, &g));
            opt(w, *secret, |w, s| w.raw(&s));
        }
        Reply::Pushed { results, made } => {
            w.u8(14);
            w.u32(results.len() as u32);
            for res in results {
                write_result(w, res);
            }
            w.u32(made.len() as u32);
            for (a, g) in made {
                write_attr(w, a);
                grant(w, g);
            }
        }
        Reply::Locked(c) => {
            w.u8(12);
            opt(w, c.as_ref(), |w, c| {
                lock_mode(w, Some(c.mode));
                w.u64(c.start);
                w.u64(c.end);
                w.u32(c.pid);
            });
        }
        Reply::Touched {
            next,
            touched,
            missing,
        } => {
            w.u8(15);
            opt(w, *next, |w, n| w.u64(n.0));
            w.u64(*touched);
            w.u64(*missing);
        }
    }
    out
}

/// A reply from its bytes.
pub fn decode_reply(bytes: &[u8]) -> Result<Result<Reply, Failure>, DecodeError> {
    let r = &mut Reader::new(bytes, "fs reply");
    let reply = match r.u8()? {
        0 => Ok(match r.u8()? {
            1 => Reply::Hello {
                lease_ms: r.u32()?,
                root: read_attr(r)?,
                servers: {
                    let n = count(r, LIST_MAX, 48)?;
                    (0..n).map(|_| r.cap()).collect::<Result<_, _>>()?
                },
                copies: r.u8()?,
            },
            2 => {
                let n = count(r, LIST_MAX, 9)?;
                Reply::Events((0..n).map(|_| read_callback(r)).collect::<Result<_, _>>()?)
            }
            3 => Reply::Entry {
                attr: read_attr(r)?,
                grant: read_grant(r)?,
            },
            4 => {
                let n = count(r, ENTRIES_MAX, 11)?;
                let entries = (0..n)
                    .map(|_| {
                        Ok(DirEntry {
                            name: r.str16()?.to_vec(),
                            ino: Ino(r.u64()?),
                            kind: Kind::from_u8(r.u8()?)
                                .ok_or_else(|| bad("fs reply", "entry kind"))?,
                        })
                    })
                    .collect::<Result<_, DecodeError>>()?;
                Reply::Entries {
                    entries,
                    grant: read_grant(r)?,
                }
            }
            5 => Reply::Target(r.str16()?.to_vec()),
            6 => Reply::Opened {
                attr: read_attr(r)?,
                grant: read_grant(r)?,
                content: {
                    let n = count(r, LIST_MAX, 48)?;
                    (0..n).map(|_| r.cap()).collect::<Result<_, _>>()?
                },
            },
            7 => Reply::Data(data(r)?),
            8 => Reply::Updated(read_result(r, false)?),
            9 => Reply::StatFs(StatFs {
                block_size: r.u32()?,
                blocks: r.u64()?,
                blocks_free: r.u64()?,
                files: r.u64()?,
                files_free: r.u64()?,
            }),
            10 => Reply::Status(
                String::from_utf8(r.bytes32()?.to_vec())
                    .map_err(|_| bad("fs reply", "status is not UTF-8"))?,
            ),
            11 => Reply::Done,
            13 => Reply::Changed {
                result: read_result(r, false)?,
                dirs: {
                    let n = count(r, LIST_MAX, 8)?;
                    (0..n).map(|_| read_attr(r)).collect::<Result<_, _>>()?
                },
                opened: read_opt(r, read_grant)?,
                secret: read_opt(r, |r| r.array())?,
            },
            14 => Reply::Pushed {
                results: {
                    let n = count(r, crate::update::PUSH_MAX, 1)?;
                    (0..n)
                        .map(|_| read_result(r, true))
                        .collect::<Result<_, _>>()?
                },
                made: {
                    let n = count(r, crate::update::PUSH_MAX, 8)?;
                    (0..n)
                        .map(|_| Ok((read_attr(r)?, read_grant(r)?)))
                        .collect::<Result<_, _>>()?
                },
            },
            15 => Reply::Touched {
                next: read_opt(r, |r| r.u64().map(Ino))?,
                touched: r.u64()?,
                missing: r.u64()?,
            },
            12 => Reply::Locked(read_opt(r, |r| {
                Ok(Conflict {
                    mode: read_lock_mode(r)?
                        .ok_or(bad("fs reply", "a conflict that is no lock"))?,
                    start: r.u64()?,
                    end: r.u64()?,
                    pid: r.u32()?,
                })
            })?),
            _ => return Err(bad("fs reply", "unknown kind")),
        }),
        1 => Err(Failure::Fs(FsError::from_errno(i32::from(r.u16()?)))),
        2 => Err(Failure::NoSession),
        3 => Err(Failure::NotPrimary),
        4 => Err(Failure::Unavailable(r.text16(u16::MAX as usize)?)),
        _ => return Err(bad("fs reply", "unknown status")),
    };
    r.end()?;
    Ok(reply)
}
