//! How the regulator starts a member: a launcher command (a template the
//! user gives, or a local `strom server --join` by default), split into
//! words like a shell would (quotes and backslashes; no expansion), with
//! `{group_file}`, `{dir}`, `{data_dir}`, `{n}` and `{strom}` filled in,
//! and run without a shell. Owns the launched processes: it reaps them and
//! knows which member each became.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context};

/// The launcher when none is given: a server on this node.
pub const DEFAULT_TEMPLATE: &str = "{strom} server --join {group_file} --data-dir {data_dir}";

/// Placeholders a template may use.
const PLACEHOLDERS: [&str; 5] = ["{group_file}", "{dir}", "{data_dir}", "{n}", "{strom}"];

/// Splits `s` into words: blanks separate words; single quotes keep
/// everything; double quotes keep everything but `\"` and `\\`; a
/// backslash outside quotes keeps the next character.
pub fn split_words(s: &str) -> anyhow::Result<Vec<String>> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => words.extend(word.take()),
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => bail!("unterminated ' in the launcher"),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\')) => w.push(c),
                            Some(c) => w.extend(['\\', c]),
                            None => bail!("unterminated \" in the launcher"),
                        },
                        Some(c) => w.push(c),
                        None => bail!("unterminated \" in the launcher"),
                    }
                }
            }
            '\\' => match chars.next() {
                Some(c) => word.get_or_insert_with(String::new).push(c),
                None => bail!("the launcher ends with a lone backslash"),
            },
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    Ok(words)
}

/// A parsed launcher template.
#[derive(Clone, Debug)]
pub struct Template {
    words: Vec<String>,
}

impl Template {
    /// Parses and checks `s`: at least a program, and no `{...}` but the
    /// known placeholders.
    pub fn parse(s: &str) -> anyhow::Result<Template> {
        let words = split_words(s)?;
        if words.is_empty() {
            bail!("the launcher is empty");
        }
        for w in &words {
            let mut rest = w.as_str();
            while let Some(i) = rest.find('{') {
                let tail = &rest[i..];
                match PLACEHOLDERS.iter().find(|p| tail.starts_with(*p)) {
                    Some(p) => rest = &tail[p.len()..],
                    None => bail!(
                        "unknown placeholder in the launcher word '{w}': use {}",
                        PLACEHOLDERS.join(", ")
                    ),
                }
            }
        }
        Ok(Template { words })
    }

    pub fn uses(&self, placeholder: &str) -> bool {
        self.words.iter().any(|w| w.contains(placeholder))
    }

    /// The command's words with the placeholders filled in.
    pub fn expand(&self, v: &Vars) -> Vec<String> {
        let n = v.n.to_string();
        self.words
            .iter()
            .map(|w| {
                w.replace("{group_file}", &v.group_file)
                    .replace("{dir}", &v.dir)
                    .replace("{data_dir}", &v.data_dir)
                    .replace("{n}", &n)
                    .replace("{strom}", &v.strom)
            })
            .collect()
    }
}

/// What the placeholders stand for.
pub struct Vars {
    pub group_file: String,
    pub dir: String,
    pub data_dir: String,
    pub n: u32,
    pub strom: String,
}

/// One launched process.
pub struct Launched {
    pub n: u32,
    pub child: Child,
    /// The member it became, once it joined.
    pub member: Option<u32>,
    pub log: PathBuf,
}

/// Starts members and keeps their processes.
pub struct Launcher {
    template: Template,
    dir: PathBuf,
    group_file: String,
    strom: String,
    pub launched: Vec<Launched>,
    /// Members it started, the earliest first, whether or not their
    /// launcher still runs (a batch submission returns at once).
    started: Vec<u32>,
}

impl Launcher {
    pub fn new(
        template: Template,
        dir: PathBuf,
        group_file: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let group_file = match group_file {
            Some(g) => path_str(g)?.to_string(),
            None if template.uses("{group_file}") => {
                bail!("the launcher needs the group file ({{group_file}}): pass --group-file")
            }
            None => String::new(),
        };
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating the members' directory {}", dir.display()))?;
        let strom = std::env::current_exe().context("finding the strom binary")?;
        Ok(Launcher {
            template,
            group_file,
            strom: path_str(&strom)?.to_string(),
            dir,
            launched: Vec::new(),
            started: Vec::new(),
        })
    }

    /// Starts the next member: `{n}` is the first number whose `m{n}`
    /// directory under `dir` does not exist yet (so its data directory is
    /// fresh), its output goes to `dir/m{n}.log`.
    pub fn launch(&mut self) -> anyhow::Result<&Launched> {
        let n = (1..u32::MAX)
            .find(|n| {
                !self.dir.join(format!("m{n}")).exists()
                    && !self.dir.join(format!("m{n}.log")).exists()
            })
            .context("no free member number")?;
        let data_dir = self.dir.join(format!("m{n}"));
        let vars = Vars {
            group_file: self.group_file.clone(),
            dir: path_str(&self.dir)?.to_string(),
            data_dir: path_str(&data_dir)?.to_string(),
            n,
            strom: self.strom.clone(),
        };
        let words = self.template.expand(&vars);
        let log = self.dir.join(format!("m{n}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        tracing::info!(n, command = ?words, log = %log.display(), "launching a member");
        let child = Command::new(&words[0])
            .args(&words[1..])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("running the launcher {:?}", words[0]))?;
        self.launched.push(Launched {
            n,
            child,
            member: None,
            log,
        });
        Ok(self.launched.last().expect("just pushed"))
    }

    /// Launch `n` became `member`.
    pub fn joined(&mut self, n: u32, member: u32) {
        if let Some(x) = self.launched.iter_mut().find(|x| x.n == n) {
            x.member = Some(member);
        }
        self.started.push(member);
    }

    /// Members it started, the earliest first.
    pub fn members(&self) -> Vec<u32> {
        self.started.clone()
    }

    /// Reaps launched processes that ended, logging how; keeps the rest.
    pub fn reap(&mut self) {
        self.launched.retain_mut(|l| match l.child.try_wait() {
            Ok(None) => true,
            Ok(Some(status)) => {
                tracing::info!(n = l.n, member = ?l.member, %status, "a launched member's process ended");
                false
            }
            Err(e) => {
                tracing::warn!(n = l.n, error = %e, "polling a launched process");
                true
            }
        });
    }

    /// Stops the launched process `n` (one that never joined): SIGKILL
    /// and reap.
    pub fn abandon(&mut self, n: u32) {
        if let Some(i) = self.launched.iter().position(|l| l.n == n) {
            let mut l = self.launched.remove(i);
            let _ = l.child.kill();
            let _ = l.child.wait();
        }
    }

    /// Members it started that are still in `group`.
    pub fn in_group(&self, group: &BTreeSet<u32>) -> Vec<u32> {
        self.members()
            .into_iter()
            .filter(|m| group.contains(m))
            .collect()
    }
}

fn path_str(p: &Path) -> anyhow::Result<&str> {
    p.to_str()
        .with_context(|| format!("the path {} is not UTF-8", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_like_a_shell_without_expansion() {
        let w = split_words(
            r#"srun --jobid 12 sh -c 'exec strom server --join {group_file}' a\ b "x \"y\" $HOME""#,
        )
        .unwrap();
        assert_eq!(
            w,
            [
                "srun",
                "--jobid",
                "12",
                "sh",
                "-c",
                "exec strom server --join {group_file}",
                "a b",
                "x \"y\" $HOME"
            ]
        );
        assert_eq!(split_words("  ''  ").unwrap(), [""]);
        assert!(split_words("a 'b").is_err());
        assert!(split_words("a \"b").is_err());
        assert!(split_words("a \\").is_err());
    }

    #[test]
    fn placeholders_are_filled_in_and_unknown_ones_refused() {
        let t = Template::parse(
            "{strom} server --join {group_file} --data-dir {dir}/m{n} --x {data_dir}",
        )
        .unwrap();
        let v = Vars {
            group_file: "/g.json".into(),
            dir: "/scratch".into(),
            data_dir: "/scratch/m3".into(),
            n: 3,
            strom: "/bin/strom".into(),
        };
        assert_eq!(
            t.expand(&v),
            [
                "/bin/strom",
                "server",
                "--join",
                "/g.json",
                "--data-dir",
                "/scratch/m3",
                "--x",
                "/scratch/m3"
            ]
        );
        assert!(Template::parse("strom {groupfile}").is_err());
        assert!(Template::parse("strom {").is_err());
        assert!(Template::parse("   ").is_err());
        assert!(Template::parse(DEFAULT_TEMPLATE).is_ok());
    }
}
