//! Build-time tasks of the workspace, run by `make build`:
//!
//! `xtask shell-files DIR` writes, for every binary (`longhaul`,
//! `longhaul-exporter`, `longhaul-delay`), bash and zsh completions and man
//! pages generated from the binaries' own clap definitions:
//!
//! ```text
//! DIR/completions/bash/<binary>
//! DIR/completions/zsh/_<binary>
//! DIR/man/man1/<binary>.1 (and <binary>-<subcommand>.1)
//! ```
//!
//! The roles install them (longhaul_engine, longhaul_exporter).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Command, CommandFactory};
use clap_complete::Shell;

/// Every binary of the workspace, by name, with its command line.
fn binaries() -> Vec<(&'static str, Command)> {
    vec![
        ("longhaul", longhaul::args::Cli::command()),
        ("longhaul-exporter", longhaul_exporter::cli::command()),
        ("longhaul-delay", longhaul_delay::cli::Cli::command()),
    ]
}

/// Shells completions are written for, and their directory under
/// `completions/`.
const SHELLS: &[(Shell, &str)] = &[(Shell::Bash, "bash"), (Shell::Zsh, "zsh")];

/// Writes completions and man pages of every binary under `dir`; returns
/// the files written.
pub fn shell_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let man = dir.join("man/man1");
    std::fs::create_dir_all(&man).with_context(|| format!("creating {}", man.display()))?;
    let mut written = Vec::new();
    for (name, cmd) in binaries() {
        for (shell, sub) in SHELLS {
            let out = dir.join("completions").join(sub);
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            let mut cmd = cmd.clone();
            let mut path = clap_complete::generate_to(*shell, &mut cmd, name, &out)
                .with_context(|| format!("{name}: {sub} completion"))?;
            if *shell == Shell::Bash {
                // bash-completion looks files up by the command's name.
                let plain = out.join(name);
                std::fs::rename(&path, &plain)?;
                path = plain;
            }
            written.push(path);
        }
        let before: Vec<PathBuf> = list(&man)?;
        clap_mangen::generate_to(cmd.name(name), &man)
            .with_context(|| format!("{name}: man pages"))?;
        written.extend(list(&man)?.into_iter().filter(|p| !before.contains(p)));
    }
    Ok(written)
}

fn list(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    v.sort();
    Ok(v)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [task, dir] if task == "shell-files" => {
            for path in shell_files(Path::new(dir))? {
                println!("{}", path.display());
            }
            Ok(())
        }
        _ => bail!("usage: xtask shell-files DIR (completions and man pages into DIR)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_and_man_pages_of_every_binary() {
        let dir = std::env::temp_dir().join(format!("xtask-shell-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        shell_files(&dir).unwrap();
        let read =
            |p: &str| std::fs::read_to_string(dir.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        let bash = read("completions/bash/longhaul");
        for word in [
            "serve",
            "send",
            "sweep",
            "advise",
            "report",
            "--streams",
            "--bidir",
        ] {
            assert!(bash.contains(word), "bash completion lacks {word}");
        }
        let zsh = read("completions/zsh/_longhaul");
        assert!(zsh.starts_with("#compdef longhaul"), "{}", &zsh[..40]);
        assert!(zsh.contains("--checksum"));
        let exporter = read("completions/bash/longhaul-exporter");
        for word in [
            "--web.listen-address",
            "--collector.raid",
            "--no-collector.tcp",
        ] {
            assert!(exporter.contains(word), "exporter completion lacks {word}");
        }
        assert!(read("completions/zsh/_longhaul-exporter").contains("--collector.tcp.ports"));
        assert!(read("completions/bash/longhaul-delay").contains("--delay"));
        let man = read("man/man1/longhaul.1");
        assert!(man.contains(".TH longhaul 1"), "{}", &man[..80]);
        let send = read("man/man1/longhaul-send.1");
        assert!(
            send.contains("\\-\\-streams"),
            "send's man page lists its flags"
        );
        assert!(read("man/man1/longhaul-exporter.1").contains("collector.tcp.ports"));
        assert!(dir.join("man/man1/longhaul-delay-probe.1").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
