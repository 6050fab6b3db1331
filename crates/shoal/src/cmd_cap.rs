//! `shoal cap ...`: what a capability grants, and narrowing it.  Both work
//! offline: restriction needs no server, which is the point of the chained
//! check field.

use clap::Subcommand;
use shoal_cap::{Capability, Rights};

use crate::Failure;

#[derive(Subcommand)]
pub enum CapCommand {
    /// Show a capability's port, object and rights.
    Show {
        /// The capability (cap1:...), or `-` (read from standard input) or
        /// @FILE, to keep it off the command line.
        #[arg(value_parser = crate::cli::secret::<Capability>)]
        cap: Capability,
    },
    /// Print a capability with fewer rights (never more).
    Restrict {
        /// The capability (cap1:...), or `-` (read from standard input) or
        /// @FILE.
        #[arg(value_parser = crate::cli::secret::<Capability>)]
        cap: Capability,
        /// Rights to keep, as 8 letters "rwcdax67" with '-' for a right
        /// dropped (e.g. r-------), or 0xNN.
        #[arg(long)]
        rights: Rights,
    },
}

pub fn run(command: CapCommand) -> Result<(), Failure> {
    match command {
        CapCommand::Show { cap } => {
            println!("port    {}", cap.port());
            println!("object  {}", cap.object());
            println!("rights  {}", cap.rights());
            let chain: Vec<String> = cap.chain()[..=cap.steps()]
                .iter()
                .map(ToString::to_string)
                .collect();
            println!(
                "chain   {} ({} restriction steps used of {})",
                chain.join(" > "),
                cap.steps(),
                Capability::MAX_STEPS
            );
            Ok(())
        }
        CapCommand::Restrict { cap, rights } => {
            let narrowed = cap
                .restrict(rights)
                .map_err(|e| Failure::failed(e.to_string()))?;
            if !rights.is_subset_of(cap.rights()) {
                eprintln!(
                    "shoal: note: rights {} were never held; kept {}",
                    rights.difference(cap.rights()),
                    narrowed.rights()
                );
            }
            println!("{narrowed}");
            Ok(())
        }
    }
}
