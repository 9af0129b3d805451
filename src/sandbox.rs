//! Test-rendering new template text in a child process with memory and CPU limits before it is
//! loaded into the webhook (see `engine::templates::set::PreCheck` for why).
//!
//! The child is this same binary (`sidecar-injector sandbox-check`, hidden): it reads the sources
//! as JSON on stdin and loads each one (parse, compile, test-render), writing a line before and
//! after each (with its errors), so the parent learns every template's result without loading any
//! of them itself. When the child dies (memory, CPU, time), the template it had begun is the
//! culprit: it is refused and a new child checks the ones after it. Every check has a deadline.
//!
//! Why these limits: a template that passes is then loaded in the webhook's own process, so what
//! it may use in the child must fit, with the webhook's own needs and the requests in flight,
//! inside the Deployment's memory limit (256 MiB, `deploy/base/deployment.yaml`). A real template
//! loads in a few MiB (the child itself maps about 30 MiB); 96 MiB of address space leaves room for
//! both. The child is a single thread, so glibc keeps its heap in one arena and the limit holds.
//! The callers run checks on blocking threads, one at a time (`state::AppState::template_work`).

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use crate::engine::templates::set::PreCheck;
use crate::engine::{Template, TemplateError, TemplateSource};

/// Address space the child may use (see the module doc).
pub const MEMORY_LIMIT_BYTES: u64 = 96 * 1024 * 1024;
/// CPU time one child may use. A real template is checked in milliseconds.
pub const CPU_LIMIT_SECONDS: u64 = 2;
/// Wall-clock time before one child is killed.
pub const TIMEOUT: Duration = Duration::from_secs(3);
/// Wall-clock time for a whole check, however many children it takes: the ConfigMap guard must
/// answer within its webhook's `timeoutSeconds` (10 s).
pub const DEADLINE: Duration = Duration::from_secs(8);
/// Most output read from one child (its error messages).
const MAX_CHILD_OUTPUT: u64 = 4 * 1024 * 1024;

/// The child-process pre-check.
#[derive(Debug, Clone)]
pub struct Sandbox {
    program: PathBuf,
}

impl Sandbox {
    /// A sandbox that runs `program sandbox-check` (normally this binary).
    pub fn new(program: PathBuf) -> Self {
        Sandbox { program }
    }

    /// A sandbox running this very binary.
    pub fn current_exe() -> std::io::Result<Self> {
        Ok(Sandbox::new(std::env::current_exe()?))
    }

    /// Loads `sources` in a child: the results of those it got through, in order, and, when it did
    /// not finish, the index of the one it died on and why.
    fn run(&self, sources: &[&TemplateSource], deadline: Instant) -> ChildRun {
        let input: Vec<(&str, &str)> = sources.iter().map(|s| (s.name.as_str(), s.text.as_str())).collect();
        let mut command = Command::new(&self.program);
        command.arg("sandbox-check").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null());
        // SAFETY: setrlimit is async-signal-safe and touches no parent memory.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(|| {
                let limit = |resource, value: u64| {
                    let rlimit = libc::rlimit { rlim_cur: value, rlim_max: value };
                    libc::setrlimit(resource, &rlimit)
                };
                limit(libc::RLIMIT_AS, MEMORY_LIMIT_BYTES);
                limit(libc::RLIMIT_CPU, CPU_LIMIT_SECONDS);
                limit(libc::RLIMIT_CORE, 0);
                Ok(())
            });
        }
        let failed = |why: String| ChildRun { results: Vec::new(), died: Some((0, why)) };
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => return failed(format!("the template sandbox could not start ({}): {e}", self.program.display())),
        };
        // Feed stdin and drain stdout on threads, so neither pipe can fill up and stall the child.
        let input = serde_json::to_vec(&input).expect("sources serialize");
        let mut stdin = child.stdin.take().expect("piped");
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        let stdout = child.stdout.take().expect("piped");
        let reader = std::thread::spawn(move || {
            let mut output = String::new();
            let _ = stdout.take(MAX_CHILD_OUTPUT).read_to_string(&mut output);
            output
        });
        let limit = deadline.min(Instant::now() + TIMEOUT);
        let ended = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Ok(status.success()),
                Ok(None) if Instant::now() >= limit => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break Err(format!("test-rendering it did not finish within {} s", TIMEOUT.as_secs()));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break Err(format!("the template sandbox failed: {e}"));
                }
            }
        };
        let _ = writer.join();
        let output = reader.join().unwrap_or_default();
        let mut run = ChildRun::parse(&output, sources);
        match ended {
            Ok(true) if run.results.len() == sources.len() => {}
            Ok(_) => {
                let why = format!(
                    "test-rendering it exceeded the sandbox limits ({} MiB of memory, {CPU_LIMIT_SECONDS} s of CPU)",
                    MEMORY_LIMIT_BYTES / 1024 / 1024
                );
                run.died = Some((run.results.len(), why));
            }
            Err(why) => run.died = Some((run.results.len(), why)),
        }
        run
    }
}

/// What one child got through.
struct ChildRun {
    /// Each source it finished, in order: its errors, if any.
    results: Vec<Option<TemplateError>>,
    /// The index of the source it was working on when it ended early, and why.
    died: Option<(usize, String)>,
}

impl ChildRun {
    /// Reads the child's `done <index> <error JSON or null>` lines.
    fn parse(output: &str, sources: &[&TemplateSource]) -> ChildRun {
        let mut results = Vec::new();
        for line in output.lines() {
            let Some(rest) = line.strip_prefix("done ") else { continue };
            let Some((index, error)) = rest.split_once(' ') else { break };
            if index.parse::<usize>().ok() != Some(results.len()) {
                break;
            }
            let error: Option<(Option<u64>, String)> = serde_json::from_str(error).unwrap_or(None);
            let source = sources[results.len()];
            results.push(error.map(|(line, message)| TemplateError { template: source.name.clone(), line, message }));
            if results.len() == sources.len() {
                break;
            }
        }
        ChildRun { results, died: None }
    }
}

impl PreCheck for Sandbox {
    /// Every source's errors as the child found them (those sources are then not loaded in this
    /// process at all), and a refusal for each source that broke the limits or was not reached
    /// before the deadline.
    fn precheck(&self, sources: &[TemplateSource]) -> Vec<TemplateError> {
        let deadline = Instant::now() + DEADLINE;
        let mut errors = Vec::new();
        let mut remaining: Vec<&TemplateSource> = sources.iter().collect();
        while !remaining.is_empty() {
            if Instant::now() >= deadline {
                errors.extend(remaining.iter().map(|s| TemplateError {
                    template: s.name.clone(),
                    line: None,
                    message: format!(
                        "not checked: the template check ran out of time ({} s) on the templates before it",
                        DEADLINE.as_secs()
                    ),
                }));
                break;
            }
            let run = self.run(&remaining, deadline);
            errors.extend(run.results.iter().flatten().cloned());
            match run.died {
                None => break,
                Some((culprit, why)) => {
                    errors.push(TemplateError { template: remaining[culprit].name.clone(), line: None, message: why });
                    remaining.drain(..=culprit);
                }
            }
        }
        errors
    }
}

/// The child: loads every source given on stdin as `[[name, text], ...]`, writing
/// `done <index> <[line, message] or null>` after each. Exits 0 when it got through all of them.
pub fn child_main() -> ExitCode {
    let mut input = Vec::new();
    if std::io::stdin().read_to_end(&mut input).is_err() {
        return ExitCode::from(2);
    }
    let Ok(sources) = serde_json::from_slice::<Vec<(String, String)>>(&input) else {
        return ExitCode::from(2);
    };
    drop(input);
    let mut stdout = std::io::stdout().lock();
    for (index, (name, text)) in sources.iter().enumerate() {
        let error = Template::load(name, text).err().map(|e| (e.line, e.message));
        let line = format!("done {index} {}\n", serde_json::to_string(&error).expect("errors serialize"));
        if stdout.write_all(line.as_bytes()).and_then(|()| stdout.flush()).is_err() {
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}
