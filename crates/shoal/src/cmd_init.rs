//! `shoal init`: a user's root directory (`docs/directory.md`, "Roots").
//!
//! - `shoal init` makes a new, empty root for the user who runs it.
//! - `shoal init --user NAME`, for root, makes the root of a user account
//!   as an administrator would: the cluster's file servers entered in it
//!   (restricted to what users may do with them), and the root linked
//!   under `users/NAME` of the administrator's root, so the object manager
//!   keeps the user's files alive. It is saved in the user's own
//!   configuration directory by a child running as that user, so root
//!   never writes where the user could have planted a link.
//! - `shoal init --set -` saves a root capability read from standard input
//!   (one that the administrator made, say) as the user's.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use shoal_cap::{Capability, Rights};
use shoal_dir::DirError;
use shoal_dirsvc::{ClientError, DirClient};

use crate::Failure;
use crate::cmd_dir::{attach, client_failure, config_dir, root_file};

/// Where users' roots are linked in the administrator's root.
const USERS_DIR: &str = "users";

#[derive(clap::Args)]
pub struct InitArgs {
    /// Replace an existing root (the old one is not deleted).
    #[arg(long)]
    force: bool,
    /// As root: make the root of the local user NAME, with the cluster's
    /// file servers in it, linked under users/NAME of your root, and save
    /// it in NAME's configuration directory.
    #[arg(long, value_name = "NAME", conflicts_with = "set")]
    user: Option<String>,
    /// Save this directory capability as your root instead of making one
    /// (`-`: read it from standard input, which keeps it out of `ps`).
    #[arg(long, value_name = "CAP")]
    set: Option<String>,
}

pub fn run(args: InitArgs) -> Result<(), Failure> {
    match (&args.user, &args.set) {
        (Some(user), _) => for_user(user, args.force),
        (None, Some(cap)) => set(cap, args.force),
        (None, None) => fresh(args.force),
    }
}

fn refuse_existing(force: bool) -> Result<PathBuf, Failure> {
    let path = root_file();
    if path.exists() && !force {
        return Err(Failure::failed(format!(
            "{} exists already (use --force to replace it)",
            path.display()
        )));
    }
    Ok(path)
}

fn save(path: &std::path::Path, root: &Capability) -> Result<(), Failure> {
    shoal_rpc::secrets::dir(&config_dir(), true)
        .and_then(|()| shoal_rpc::secrets::write(path, format!("{root}\n").as_bytes()))
        .map_err(Failure::failed)
}

/// A new, empty root for this user.
fn fresh(force: bool) -> Result<(), Failure> {
    let path = refuse_existing(force)?;
    let ctx = attach()?;
    let mut dir = DirClient::new(&ctx).map_err(client_failure)?;
    let root = dir
        .create_dir(&["owner", "group", "other"])
        .map_err(client_failure)?;
    save(&path, &root)?;
    println!("root directory {root}");
    println!("saved in {}", path.display());
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        // Root's own root is the cluster's: file servers register in it.
        eprintln!(
            "shoal: note: no file server or object manager knows this root, so files stored under it age away; for one that has them, ask root to run `shoal init --user {}`",
            whoami()
        );
    }
    Ok(())
}

/// This user's login name (or uid).
fn whoami() -> String {
    // SAFETY: getuid cannot fail.
    shoal_nodesvc::account::user_name(unsafe { libc::getuid() })
}

/// Saves a given root, once the directory service has listed it.
fn set(cap: &str, force: bool) -> Result<(), Failure> {
    let path = refuse_existing(force)?;
    let text = if cap == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| Failure::failed(format!("cannot read standard input: {e}")))?;
        s
    } else {
        cap.to_string()
    };
    let root: Capability = text
        .trim()
        .parse()
        .map_err(|e| Failure::usage(format!("not a capability: {e}")))?;
    let ctx = attach()?;
    let mut dir = DirClient::new(&ctx).map_err(client_failure)?;
    dir.list(&root)
        .map_err(|e| Failure::failed(format!("not a directory you can use: {e}")))?;
    save(&path, &root)?;
    println!("saved in {}", path.display());
    Ok(())
}

/// The administrator's part of making user `name`'s root.
fn for_user(name: &str, force: bool) -> Result<(), Failure> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Failure::failed(
            "only root makes roots for other users; run `shoal init` for your own",
        ));
    }
    let who = shoal_nodesvc::account::by_name(name)
        .ok_or_else(|| Failure::usage(format!("no user named {name}")))?;
    let admin = crate::cmd_dir::load_root(&crate::cmd_dir::Common::default())?;
    let ctx = attach()?;
    let mut dir = DirClient::new(&ctx).map_err(client_failure)?;
    let owner_only = [Rights::ALL, Rights::NONE, Rights::NONE];
    let users = match dir.lookup(&admin, USERS_DIR) {
        Ok(caps) => caps
            .into_iter()
            .find(|c| c.port() == admin.port())
            .ok_or_else(|| {
                Failure::failed(format!("{USERS_DIR} in your root is not a directory"))
            })?,
        Err(ClientError::Dir(DirError::NotFound(_))) => {
            let users = dir
                .create_dir(&["owner", "group", "other"])
                .map_err(client_failure)?;
            dir.append(&admin, USERS_DIR, &[users], Some(&owner_only))
                .map_err(client_failure)?;
            users
        }
        Err(e) => return Err(client_failure(e)),
    };
    let old = match dir.lookup(&users, name) {
        Ok(_) if !force => {
            return Err(Failure::failed(format!(
                "{USERS_DIR}/{name} exists already (use --force to give {name} a new, empty root)"
            )));
        }
        Ok(caps) => Some(caps),
        Err(ClientError::Dir(DirError::NotFound(_))) => None,
        Err(e) => return Err(client_failure(e)),
    };
    let root = dir
        .create_dir(&["owner", "group", "other"])
        .map_err(client_failure)?;
    let all = [Rights::ALL, Rights::ALL, Rights::ALL];
    match shoal_bulletsvc::manager::servers_for_users(&mut dir, &admin) {
        Ok(servers) => dir
            .append(
                &root,
                shoal_bulletsvc::manager::SERVERS_DIR,
                &[servers],
                Some(&all),
            )
            .map_err(client_failure)?,
        Err(e) => eprintln!("shoal: {e}; {name}'s root has no file servers yet"),
    }
    if let Err(e) = save_as(&who, &root, force) {
        let _ = dir.delete_dir(&root);
        return Err(e);
    }
    match old {
        Some(old) => dir.replace(&users, name, &old, &[root]),
        None => dir.append(&users, name, &[root], Some(&owner_only)),
    }
    .map_err(client_failure)?;
    println!(
        "root directory of {name} linked as {USERS_DIR}/{name} and saved in {name}'s configuration"
    );
    Ok(())
}

/// Saves `root` as the user's, by running `shoal init --set -` as them.
fn save_as(
    who: &shoal_nodesvc::account::Passwd,
    root: &Capability,
    force: bool,
) -> Result<(), Failure> {
    let me = std::env::current_exe()
        .map_err(|e| Failure::failed(format!("cannot find this program: {e}")))?;
    let mut child = std::process::Command::new(me)
        .arg("init")
        .args(force.then_some("--force"))
        .args(["--set", "-"])
        .env_remove("SHOAL_CONFIG_DIR")
        .env_remove("XDG_CONFIG_HOME")
        .env("HOME", &who.home)
        .current_dir("/")
        .uid(who.uid)
        .gid(who.gid)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(|e| Failure::failed(format!("cannot run as the user: {e}")))?;
    let mut stdin = child.stdin.take().expect("piped");
    let _ = writeln!(stdin, "{root}");
    drop(stdin);
    let status = child
        .wait()
        .map_err(|e| Failure::failed(format!("cannot run as the user: {e}")))?;
    if !status.success() {
        return Err(Failure::failed(format!(
            "the user's root could not be saved in {}/.config/shoal{}",
            who.home.display(),
            if force {
                ""
            } else {
                " (if they have one, --force replaces it)"
            }
        )));
    }
    Ok(())
}
