//! Several programs in one `berth run` (MPMD): mpiexec's colon line
//! (`berth run -n 2 ./a.out : -n 4 ./b.out`) and srun's `--multi-prog FILE`, read into the
//! step's apps (`berth_core::step::mpmd`; docs/launcher.md, "Several programs in one step").
//!
//! The options before the first program are `run`'s own: they apply to the whole step, and
//! `-n`, `-N`, `--ntasks-per-node`, `-d` and `--binding` among them lay out part 0. A lone `:`
//! starts the next part, which may give its own layout and environment before its program:
//! `-n`/`-np`/`--ntasks`, `-N`/`--nodes`, `--ntasks-per-node`, `-d`/`--cpus-per-task`,
//! `--binding`, `--overcommit` (`-O`: its ranks may share cores with the parts before it),
//! `--env NAME=VALUE` (also hydra's `-env NAME VALUE`), `--chdir DIR` (also `-wdir DIR`). A
//! later part takes `-d`, `--binding` and `--overcommit` from part 0 unless it gives its own;
//! its ranks follow the parts before it. A part's own `--gpus-per-task N` and `--gpu-bind HOW`
//! (inside a job) give its ranks their GPUs instead of part 0's options, which are the step's
//! default (`BERTH_GPUS_PER_TASK`, `BERTH_GPU_BIND` in the part's variables; the agents deal
//! each part's ranks GPUs no earlier part's rank has, when enough are left).

use anyhow::{anyhow, bail, Context, Result};
use berth_core::step::mpmd::{self, App, MAX_APPS, MAX_MULTI_PROG_BYTES};
use berth_core::step::{RankBinding, StepRequest};
use std::io::Read;

/// What a later part may say before its program, for error messages.
const PART_OPTIONS: &str = "-n N, -N NODES, --ntasks-per-node K, -d CPUS, --binding linear|striding|none, \
     --overcommit, --gpus-per-task N, --gpu-bind HOW, --env NAME=VALUE, --chdir DIR";

/// The command split at lone `:` words (one slice: no MPMD).
pub fn split_colon(command: &[String]) -> Vec<&[String]> {
    command.split(|w| w == ":").collect()
}

/// One later part of a colon line: its own layout (defaults: part 0's `-d` and binding),
/// variables, directory (relative to `cwd`) and program.
fn parse_part(words: &[String], first: &StepRequest, cwd: &str, index: usize) -> Result<App> {
    let n = index + 1;
    let mut req = StepRequest {
        ntasks: None,
        nodes: None,
        tasks_per_node: None,
        cpus_per_task: first.cpus_per_task,
        overcommit: first.overcommit,
        binding: first.binding,
        gpus_per_task: first.gpus_per_task,
    };
    let mut app = App::default();
    let mut i = 0;
    while i < words.len() {
        let word = words[i].as_str();
        if !word.starts_with('-') || word == "-" {
            break;
        }
        let (flag, attached) = match word.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (word, None),
        };
        if matches!(flag, "--overcommit" | "-O") && attached.is_none() {
            req.overcommit = true;
            i += 1;
            continue;
        }
        let takes = matches!(
            flag,
            "-n" | "-np"
                | "--ntasks"
                | "-N"
                | "--nodes"
                | "--ntasks-per-node"
                | "--tasks-per-node"
                | "-d"
                | "--cpus-per-task"
                | "--binding"
                | "--gpus-per-task"
                | "--gpu-bind"
                | "--env"
                | "-env"
                | "--chdir"
                | "-wdir"
        );
        if !takes {
            bail!(
                "part {n} of the MPMD command: unknown option {word:?}; a part takes {PART_OPTIONS} before its program"
            );
        }
        let mut value = |what: &str| -> Result<String> {
            if let Some(v) = &attached {
                return Ok(v.clone());
            }
            i += 1;
            words.get(i).cloned().ok_or_else(|| anyhow!("part {n} of the MPMD command: {flag} needs {what}"))
        };
        let count = |v: String| -> Result<u32> {
            v.parse::<u32>()
                .ok()
                .filter(|&c| c > 0)
                .ok_or_else(|| anyhow!("part {n} of the MPMD command: {flag} {v:?}: expected a positive number"))
        };
        match flag {
            "-n" | "-np" | "--ntasks" => req.ntasks = Some(count(value("a count")?)?),
            "-N" | "--nodes" => req.nodes = Some(count(value("a count")?)?),
            "--ntasks-per-node" | "--tasks-per-node" => req.tasks_per_node = Some(count(value("a count")?)?),
            "-d" | "--cpus-per-task" => req.cpus_per_task = Some(count(value("a count")?)?),
            "--binding" => {
                let b = value("linear, striding or none")?;
                req.binding = RankBinding::parse(&b).ok_or_else(|| {
                    anyhow!("part {n} of the MPMD command: --binding {b}: expected linear, striding or none")
                })?;
            }
            "--gpus-per-task" => {
                let g = count(value("a count")?)?;
                if g > MAX_GPUS_PER_TASK {
                    bail!("part {n} of the MPMD command: --gpus-per-task {g}: at most {MAX_GPUS_PER_TASK}");
                }
                req.gpus_per_task = Some(g);
                set_var(&mut app.env, "BERTH_GPUS_PER_TASK", g.to_string());
            }
            "--gpu-bind" => {
                let b = value("a GPU binding")?;
                berth_core::gpu::GpuBind::parse(&b)
                    .map_err(|e| anyhow!("part {n} of the MPMD command: --gpu-bind {}: {e}", b.escape_debug()))?;
                set_var(&mut app.env, "BERTH_GPU_BIND", b);
            }
            "--env" => app.env.push(env_pair(&value("NAME=VALUE")?).map_err(|e| anyhow!("part {n}: {e}"))?),
            "-env" => {
                let name = value("NAME VALUE")?;
                let v = value("NAME VALUE")?;
                app.env.push(env_pair(&format!("{name}={v}")).map_err(|e| anyhow!("part {n}: {e}"))?);
            }
            _ => app.cwd = Some(absolute(&value("a directory")?, cwd)),
        }
        i += 1;
    }
    app.argv = words[i.min(words.len())..].to_vec();
    if app.argv.is_empty() {
        bail!("part {n} of the MPMD command has no program: write `: [OPTIONS] PROGRAM [ARGS...]`");
    }
    app.request = Some(req);
    Ok(app)
}

/// The most GPUs a part's rank may ask for.
const MAX_GPUS_PER_TASK: u32 = 256;

fn set_var(env: &mut Vec<(String, String)>, name: &str, value: String) {
    env.retain(|(k, _)| k != name);
    env.push((name.to_string(), value));
}

/// `NAME=VALUE` of `--env`.
pub fn env_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !k.contains('\0') && !v.contains('\0') => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("--env {s:?}: expected NAME=VALUE")),
    }
}

fn absolute(dir: &str, cwd: &str) -> String {
    if dir.starts_with('/') {
        dir.to_string()
    } else {
        format!("{}/{dir}", cwd.trim_end_matches('/'))
    }
}

/// The apps of a colon line (None: one program): part 0 is `command`'s first program laid out
/// by `first`, the step's own request.
pub fn colon_apps(command: &[String], first: &StepRequest, cwd: &str) -> Result<Option<Vec<App>>> {
    let parts = split_colon(command);
    if parts.len() < 2 {
        return Ok(None);
    }
    if parts.len() > MAX_APPS {
        bail!("{} programs in one MPMD command; at most {MAX_APPS}", parts.len());
    }
    if parts[0].is_empty() {
        bail!("part 1 of the MPMD command has no program: write `berth run [OPTIONS] PROGRAM [ARGS] : [OPTIONS] PROGRAM [ARGS]`");
    }
    let mut apps = vec![App { argv: parts[0].to_vec(), request: Some(first.clone()), ..Default::default() }];
    for (i, words) in parts.iter().enumerate().skip(1) {
        apps.push(parse_part(words, first, cwd, i)?);
    }
    Ok(Some(apps))
}

/// Read srun's `--multi-prog` file (at most [`MAX_MULTI_PROG_BYTES`]): its lines' apps, each
/// with its ranks (`*`: the rest).
pub fn multi_prog_apps(path: &str) -> Result<Vec<App>> {
    let file = std::fs::File::open(path).with_context(|| format!("--multi-prog: cannot open {path}"))?;
    let mut text = String::new();
    file.take(MAX_MULTI_PROG_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("--multi-prog: reading {path} (a text file of `RANKS PROGRAM ARGS...` lines)"))?;
    mpmd::parse_multi_prog(&text).map_err(|e| anyhow!("--multi-prog {path}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn a_colon_line_gives_each_part_its_own_layout_and_environment() {
        let first =
            StepRequest { ntasks: Some(2), cpus_per_task: Some(2), binding: RankBinding::None, ..Default::default() };
        let line = v("./a.out x : -np 4 --env A=1 -env B 2 -wdir sub ./b.out -n 9 : --ntasks=1 -N 1 --binding=linear --chdir /t c");
        let apps = colon_apps(&line, &first, "/home/u/").unwrap().unwrap();
        assert_eq!(apps.len(), 3);
        assert_eq!((apps[0].argv.clone(), apps[0].request.clone()), (v("./a.out x"), Some(first.clone())));
        let b = &apps[1];
        assert_eq!(b.argv, v("./b.out -n 9"), "the program's own options stay its own");
        assert_eq!(b.env, vec![("A".into(), "1".into()), ("B".into(), "2".into())]);
        assert_eq!(b.cwd.as_deref(), Some("/home/u/sub"));
        let r = b.request.clone().unwrap();
        assert_eq!(
            (r.ntasks, r.cpus_per_task, r.binding),
            (Some(4), Some(2), RankBinding::None),
            "-d and binding from part 0"
        );
        let r = apps[2].request.clone().unwrap();
        assert_eq!((r.ntasks, r.nodes, r.binding), (Some(1), Some(1), RankBinding::Linear));
        assert_eq!(apps[2].cwd.as_deref(), Some("/t"));
        assert_eq!(colon_apps(&v("./a.out x"), &first, "/").unwrap(), None, "one program: no apps");
    }

    #[test]
    fn a_part_may_overcommit_on_its_own_or_take_part_0s() {
        let apps = colon_apps(&v("a : -n 2 --overcommit b : -O c : d"), &StepRequest::default(), "/").unwrap().unwrap();
        let over: Vec<bool> = apps.iter().map(|a| a.request.clone().unwrap().overcommit).collect();
        assert_eq!(over, [false, true, true, false]);
        assert_eq!(apps[1].argv, v("b"));
        let first = StepRequest { overcommit: true, ..Default::default() };
        let apps = colon_apps(&v("a : b"), &first, "/").unwrap().unwrap();
        assert!(apps[1].request.clone().unwrap().overcommit, "part 0's --overcommit carries over");
    }

    #[test]
    fn a_part_gives_its_own_gpus_per_task_and_binding() {
        let first = StepRequest { gpus_per_task: Some(2), ..Default::default() };
        let apps =
            colon_apps(&v("a : -n 2 --gpus-per-task 1 --gpu-bind=closest b : --gpu-bind none c : d"), &first, "/")
                .unwrap()
                .unwrap();
        let var = |i: usize, k: &str| apps[i].env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(apps[1].request.clone().unwrap().gpus_per_task, Some(1));
        assert_eq!(var(1, "BERTH_GPUS_PER_TASK").as_deref(), Some("1"));
        assert_eq!(var(1, "BERTH_GPU_BIND").as_deref(), Some("closest"));
        assert_eq!(var(2, "BERTH_GPU_BIND").as_deref(), Some("none"));
        assert_eq!(var(2, "BERTH_GPUS_PER_TASK"), None, "part 0's count is the step's default");
        assert!(apps[3].env.is_empty(), "a part without GPU options takes the step's");
        assert_eq!(apps[3].argv, v("d"));
    }

    #[test]
    fn bad_colon_lines_say_which_part_and_what_to_do() {
        let first = StepRequest::default();
        for (line, want) in [
            ("a : -n 2", "part 2 of the MPMD command has no program"),
            ("a :", "part 2 of the MPMD command has no program"),
            (": b", "part 1 of the MPMD command has no program"),
            ("a : -x 2 b", "unknown option \"-x\""),
            ("a : --gpus-per-task 0 b", "--gpus-per-task \"0\": expected a positive number"),
            ("a : --gpus-per-task 2000 b", "--gpus-per-task 2000: at most 256"),
            ("a : --gpu-bind=sideways b", "--gpu-bind sideways"),
            ("a : -n 0 b", "expected a positive number"),
            ("a : -n", "-n needs a count"),
            ("a : --binding sideways b", "expected linear, striding or none"),
            ("a : --env NOEQUALS b", "expected NAME=VALUE"),
        ] {
            let e = colon_apps(&v(line), &first, "/").unwrap_err().to_string();
            assert!(e.contains(want), "{line}: {e}");
        }
        let many: Vec<String> = (0..=MAX_APPS).flat_map(|_| v("a :")).chain(v("a")).collect();
        assert!(colon_apps(&many, &first, "/").unwrap_err().to_string().contains("at most 1024"));
    }

    #[test]
    fn a_multi_prog_file_is_read_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("mp.conf");
        std::fs::write(&f, "# two programs\n0 ./a %t\n1-3 ./b %o\n").unwrap();
        let apps = multi_prog_apps(f.to_str().unwrap()).unwrap();
        assert_eq!((apps.len(), apps[1].ranks.clone()), (2, vec![(1, 3)]));
        std::fs::write(&f, "0 ./a\n1-\n").unwrap();
        let e = multi_prog_apps(f.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
        std::fs::write(&f, vec![b'#'; MAX_MULTI_PROG_BYTES + 10]).unwrap();
        let e = multi_prog_apps(f.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
        let e = multi_prog_apps("/nonexistent/mp.conf").unwrap_err().to_string();
        assert!(e.contains("cannot open /nonexistent/mp.conf"), "{e}");
    }
}
