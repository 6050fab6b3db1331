//! `shoal node join`: makes this machine's node configuration from what
//! the administrator's `shoal cluster admit` printed (`docs/operations.md`,
//! "Joining a host").  It writes the cluster's id, admin key, the node's
//! name, address and seeds into the configuration, keeping everything
//! else there (services included), and saves the certificate in the
//! node's state directory once it has checked that the certificate names
//! this node, its key and its cluster, under that admin key.

use std::net::SocketAddr;
use std::path::PathBuf;

use shoal_nodesvc::{NodeConfig, NodeConfigFile};

use crate::Failure;

/// Where an installed node keeps its configuration and its state.
pub const DEFAULT_CONFIG: &str = "/etc/shoal/node.toml";
pub const DEFAULT_STATE: &str = "/var/lib/shoal";

#[derive(clap::Args)]
pub struct JoinArgs {
    /// This node's name, as admitted.
    #[arg(long)]
    pub name: String,
    /// The address other nodes reach this one at (IP:PORT; 7700 is
    /// usual).
    #[arg(long)]
    pub addr: SocketAddr,
    /// A node already in the cluster (repeatable; the first node gives
    /// its own address).
    #[arg(long = "seed", required = true)]
    pub seeds: Vec<SocketAddr>,
    /// The cluster's id (32 hex digits).
    #[arg(long)]
    pub cluster_id: String,
    /// The admin key's public half (64 hex digits).
    #[arg(long)]
    pub admin_key: String,
    /// The node's certificate, hex, as `shoal cluster admit` printed it.
    #[arg(long)]
    pub cert: String,
    /// The configuration file to write.
    #[arg(long, short, default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// The node's state directory (default: the configuration's, else
    /// /var/lib/shoal).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

pub fn join(args: JoinArgs) -> Result<(), Failure> {
    let mut file = if args.config.exists() {
        check_config_file(&args.config)?;
        NodeConfigFile::load(&args.config)?
    } else {
        NodeConfigFile::default()
    };
    let state_dir = args
        .state_dir
        .or(file.state_dir.take())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE));
    let cert = hex::decode(args.cert.trim())
        .map_err(|_| Failure::usage("--cert must be the hex that `shoal cluster admit` printed"))?;
    file.name = Some(args.name.clone());
    file.addr = Some(args.addr);
    file.bind.get_or_insert(SocketAddr::new(
        std::net::Ipv4Addr::UNSPECIFIED.into(),
        args.addr.port(),
    ));
    file.seeds = Some(args.seeds);
    file.cluster_id = Some(args.cluster_id.trim().to_string());
    file.admin_key = Some(args.admin_key.trim().to_string());
    file.state_dir = Some(state_dir.clone());
    let config = NodeConfig::resolve(file.clone()).map_err(Failure::usage)?;
    // The node's key is made here if `shoal node key` did not make it.
    shoal_rpc::secrets::dir(&state_dir, false)?;
    shoal_nodesvc::identity::static_public_key(&state_dir)?;
    let cert_text = format!("{}\n", hex::encode(&cert));
    let staged = state_dir.join("node.cert.new");
    shoal_rpc::secrets::write(&staged, cert_text.as_bytes())?;
    let checked = shoal_nodesvc::identity::load(
        &config.name,
        &state_dir,
        &staged,
        config.cluster,
        config.admin,
        shoal_nodesvc::identity::wall(),
    );
    if let Err(e) = checked {
        let _ = std::fs::remove_file(&staged);
        // Name what the user gave, not the file it was staged in.
        let e = e.replace(&format!("{}: ", staged.display()), "");
        let e = e.replace(&staged.display().to_string(), "the certificate");
        return Err(Failure::failed(format!(
            "the certificate does not fit: {e}"
        )));
    }
    std::fs::rename(&staged, &config.cert_file)
        .map_err(|e| format!("cannot save {}: {e}", config.cert_file.display()))?;
    if let Some(parent) = args.config.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    file.save(&args.config)?;
    eprintln!(
        "{} joins cluster {} through {}: configuration in {}, certificate in {}",
        config.name,
        args.cluster_id.trim(),
        config
            .seeds
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        args.config.display(),
        config.cert_file.display()
    );
    eprintln!(
        "start it: systemctl enable --now shoal-node (or shoal node --config {})",
        args.config.display()
    );
    Ok(())
}

/// A node's configuration names what it runs as root: nobody else may
/// be able to change it.
pub fn check_config_file(path: &std::path::Path) -> Result<(), Failure> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| Failure::failed(format!("cannot read {}: {e}", path.display())))?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.is_file() || meta.uid() != me || meta.mode() & 0o022 != 0 {
        return Err(Failure::failed(format!(
            "{} must be a regular file of uid {me} that nobody else may write (it is uid {}, mode {:o}); refusing to use it",
            path.display(),
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}
