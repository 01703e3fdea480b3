//! The runner of the integration tests: libtest-mimic (`harness = false` for this
//! binary in Cargo.toml), so that a test that cannot run its oracle is reported as
//! *ignored, with the reason*, not as passed. See docs/testing.md.
//!
//! * `#[test]` is `it_macros::test` in every module of this binary (`#[macro_use]`
//!   in main.rs puts it before the built-in one): it registers the function under
//!   `module::function`, the name libtest would give it, so filters, `--exact`,
//!   `--list`, `--ignored`, `--include-ignored`, `--skip`, `--test-threads` (and
//!   `RUST_TEST_THREADS`) work as before, several filters too. `#[ignore]` is kept
//!   as a flag. [`every_test_is_registered`] checks the sources against what
//!   registered.
//! * A test returns `()` or [`Outcome`]. `Err(Skip)` ([`skip`], or `?` on a helper
//!   that needs a tool, such as `common::perf73()?`) ends it as ignored with the
//!   reason; under `PDINJECT_TEST_STRICT=1` (what `.ci/run` sets) as a failure
//!   naming what is missing. [`part`] is for a test of which only a part needs the
//!   tool: the rest runs, and the test ends ignored (or failed, under strict) naming
//!   the part's tool.
//! * Each test runs on a thread of its own named after it, as with libtest: the
//!   tests' HOME (`common::test_home`) is per thread, and a panic hook may tell the
//!   tests apart by their threads' names (tests/it/mutation.rs). A panic fails the
//!   test with its message.

use libtest_mimic::{Arguments, Completion, Failed, FormatSetting, Trial};
use std::collections::BTreeSet;
use std::process::ExitCode;
use std::sync::Mutex;

/// Why a test could not run its oracle (or a part of it): a tool, a file or a right
/// that is missing here. Made by [`skip`]; a test returns it (`Err`), directly or
/// through `?`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip {
    why: String,
}

impl Skip {
    /// A `Skip` for `why` (what is missing, and how to get it); [`skip`] wraps it in `Err`.
    pub fn new(why: impl Into<String>) -> Skip {
        Skip { why: why.into() }
    }
}

/// What a test returns: `Ok(())` when it ran (its asserts passed; a failed assert
/// panics), `Err(Skip)` when it could not run its oracle.
pub type Outcome = Result<(), Skip>;

/// Ends a test (or makes a helper's answer) as "could not run: `why`". Say what is
/// missing and how to get it: `return skip("samply not found (cargo install samply
/// --locked)")`.
pub fn skip<T>(why: impl Into<String>) -> Result<T, Skip> {
    Err(Skip::new(why))
}

/// `PDINJECT_TEST_STRICT=1` (set by `.ci/run`): a test that cannot run its oracle
/// fails instead of being ignored.
pub fn strict() -> bool {
    std::env::var_os("PDINJECT_TEST_STRICT").is_some_and(|v| v != "0" && !v.is_empty())
}

/// The tool of a part of a test that the rest of it does not need (perf 6.12 as one
/// more reader of the output, samply), or `None` when it is missing: the test leaves
/// that part out and goes on. It then ends ignored naming what was missing (a
/// failure under strict), unless it fails first.
///
/// ```ignore
/// if let Some(p612) = part(perf612()) {
///     assert_same_script(&p612, &input, &output, SCRIPT_ARGS);
/// }
/// ```
///
/// Called on the test's own thread (the one the runner starts for it).
pub fn part<T>(tool: Result<T, Skip>) -> Option<T> {
    match tool {
        Ok(t) => Some(t),
        Err(s) => {
            PARTS_LEFT_OUT.with_borrow_mut(|p| {
                let p = p.as_mut().expect(
                    "common::part is called on the test's own thread, not on one it started",
                );
                if !p.contains(&s.why) {
                    p.push(s.why);
                }
            });
            None
        }
    }
}

thread_local! {
    /// On a test's thread: what the parts it left out needed ([`part`]).
    static PARTS_LEFT_OUT: std::cell::RefCell<Option<Vec<String>>> = const { std::cell::RefCell::new(None) };
}

/// Runs a test function on its thread: its outcome, with the parts it left out.
fn run_here(test: fn() -> Outcome) -> Outcome {
    PARTS_LEFT_OUT.set(Some(Vec::new()));
    let outcome = test();
    let left_out = PARTS_LEFT_OUT.take().unwrap_or_default();
    match outcome {
        Ok(()) if left_out.is_empty() => Ok(()),
        Ok(()) => skip(format!("parts left out: {}", left_out.join("; "))),
        Err(s) if left_out.is_empty() => Err(s),
        Err(s) => skip(format!(
            "{}; parts left out before: {}",
            s.why,
            left_out.join("; ")
        )),
    }
}

/// What a test function may return.
pub trait IntoOutcome {
    fn into_outcome(self) -> Outcome;
}

impl IntoOutcome for () {
    fn into_outcome(self) -> Outcome {
        Ok(())
    }
}

impl IntoOutcome for Outcome {
    fn into_outcome(self) -> Outcome {
        self
    }
}

/// One registered test (made by `#[test]`, see `tests/it-macros`).
pub struct Test {
    /// `module_path!()` where the function is: `it::stale`.
    pub module: &'static str,
    pub name: &'static str,
    pub run: fn() -> Outcome,
    /// `#[ignore]`: run only with `--ignored` or `--include-ignored`.
    pub ignored: bool,
}

inventory::collect!(Test);

impl Test {
    /// `stale::accepts_a_chmod`: the module path without the crate's name, as libtest
    /// names tests.
    pub fn full_name(&self) -> String {
        match self.module.split_once("::") {
            Some((_, m)) => format!("{m}::{}", self.name),
            None => self.name.to_string(),
        }
    }
}

/// The tests ignored at run time, with their reasons, for the list after the summary.
static SKIPPED: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// Runs `test` on a thread of its own named after it (as libtest does).
fn run(name: String, test: fn() -> Outcome) -> Result<Completion, Failed> {
    let thread = std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || run_here(test))
        .unwrap_or_else(|e| panic!("cannot start a thread for {name}: {e}"));
    match thread.join() {
        // The hook printed the panic on its thread; libtest-mimic makes it the
        // failure's message.
        Err(payload) => std::panic::resume_unwind(payload),
        Ok(Ok(())) => Ok(Completion::Completed),
        Ok(Err(s)) if strict() => Err(Failed::from(format!(
            "{name} cannot run its oracle or service: {} (PDINJECT_TEST_STRICT is set, so this fails instead of being ignored; see docs/testing.md)",
            s.why
        ))),
        Ok(Err(s)) => {
            SKIPPED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((name, s.why.clone()));
            Ok(Completion::ignored_with(s.why))
        }
    }
}

/// The registered tests, by name (libtest's order).
fn registered() -> Vec<&'static Test> {
    let mut tests: Vec<&Test> = inventory::iter::<Test>.into_iter().collect();
    tests.sort_by_key(|t| t.full_name());
    tests
}

/// The command line: libtest-mimic's arguments, and the filters when there are more
/// than one. libtest runs the tests whose names contain any of its filters
/// (`cargo test -- stale:: cache::`); libtest-mimic takes one, so more are applied
/// here (the summary then counts no test as filtered out).
fn arguments() -> (Arguments, Vec<String>) {
    /// libtest-mimic's options that take a value.
    const WITH_VALUE: &[&str] = &[
        "--test-threads",
        "--logfile",
        "--skip",
        "--color",
        "--format",
        "-Z",
    ];
    let mut argv = std::env::args_os();
    let mut rest: Vec<std::ffi::OsString> = argv.next().into_iter().collect();
    let mut filters = Vec::new();
    let mut only_filters = false;
    while let Some(a) = argv.next() {
        match a.to_str() {
            Some(f) if only_filters || !f.starts_with('-') => filters.push(f.to_string()),
            Some("--") => only_filters = true,
            Some(o) if WITH_VALUE.contains(&o) => {
                rest.push(a);
                rest.extend(argv.next());
            }
            _ => rest.push(a),
        }
    }
    let mut args = Arguments::from_iter(rest);
    // libtest's variable, which libtest-mimic does not read.
    if args.test_threads.is_none() {
        args.test_threads = std::env::var("RUST_TEST_THREADS")
            .ok()
            .and_then(|n| n.parse().ok())
            .filter(|&n| n > 0);
    }
    if filters.len() == 1 {
        args.filter = filters.pop();
    }
    (args, filters)
}

pub fn main() -> ExitCode {
    let (args, filters) = arguments();
    let mut tests = registered();
    if !filters.is_empty() {
        tests.retain(|t| {
            let name = t.full_name();
            filters.iter().any(|f| match args.exact {
                true => name == *f,
                false => name.contains(f.as_str()),
            })
        });
    }
    let mut seen = BTreeSet::new();
    for t in &tests {
        assert!(
            seen.insert(t.full_name()),
            "two tests named {}",
            t.full_name()
        );
    }
    let trials = tests
        .iter()
        .map(|t| {
            let (name, f) = (t.full_name(), t.run);
            Trial::ignorable_test(name.clone(), move || run(name, f)).with_ignored_flag(t.ignored)
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    let skipped = std::mem::take(&mut *SKIPPED.lock().unwrap_or_else(|e| e.into_inner()));
    if !skipped.is_empty() && !args.list && !matches!(args.format, Some(FormatSetting::Json)) {
        println!(
            "{} ignored at run time: could not run their oracle (PDINJECT_TEST_STRICT=1 fails them; docs/testing.md lists what makes every test run):",
            skipped.len()
        );
        for (name, why) in &skipped {
            println!("    {name}: {why}");
        }
        println!();
    }
    conclusion.exit_code()
}

// ---------------------------------------------------------------------------
// The registration, checked against the sources

/// Every `#[test]` function in tests/it/*.rs, as (module, function, has `#[ignore]`),
/// read from the sources; and every file there is a module of main.rs.
fn tests_in_sources() -> BTreeSet<(String, String, bool)> {
    let dir = super::common::manifest_dir().join("tests/it");
    let main = std::fs::read_to_string(dir.join("main.rs")).expect("tests/it/main.rs");
    let declared: BTreeSet<&str> = main
        .lines()
        .filter_map(|l| l.trim().strip_prefix("mod ")?.strip_suffix(';'))
        .collect();
    let mut found = BTreeSet::new();
    // Each top-level file, and the files of a module's own directory
    // (tests/it/install/https.rs is a part of `install`).
    let mut files = Vec::new();
    for e in std::fs::read_dir(&dir).expect("tests/it") {
        let path = e.expect("tests/it entry").path();
        if path.is_dir() {
            let Some(module) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            for f in std::fs::read_dir(&path).expect("a tests/it module directory") {
                let f = f.expect("a tests/it module entry").path();
                if f.extension().is_some_and(|x| x == "rs") {
                    files.push((module.to_string(), f));
                }
            }
            continue;
        }
        let Some(module) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".rs"))
        else {
            continue;
        };
        files.push((module.to_string(), path));
    }
    for (module, path) in files {
        let module = module.as_str();
        if module == "main" {
            continue;
        }
        assert!(
            declared.contains(module),
            "tests/it/{module}.rs is not a module of tests/it/main.rs (`mod {module};`): its tests never run"
        );
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for (i, _) in lines.iter().enumerate().filter(|(_, l)| **l == "#[test]") {
            // The attributes and doc comments around `#[test]`, then the function.
            let mut start = i;
            while start > 0
                && (lines[start - 1].starts_with("#[") || lines[start - 1].starts_with("//"))
            {
                start -= 1;
            }
            let mut end = i + 1;
            while end < lines.len()
                && (lines[end].starts_with("#[") || lines[end].starts_with("//"))
            {
                end += 1;
            }
            let name = lines
                .get(end)
                .and_then(|l| l.split("fn ").nth(1))
                .and_then(|r| r.split('(').next())
                .unwrap_or_else(|| {
                    panic!("tests/it/{module}.rs:{}: no function after #[test]", i + 1)
                });
            let ignored = lines[start..end].iter().any(|l| l.starts_with("#[ignore"));
            found.insert((module.to_string(), name.to_string(), ignored));
        }
    }
    found
}

/// Every test in the sources registered, nothing else: a test cannot be dropped by
/// a module left out of main.rs or by a `#[test]` that is not this binary's.
#[test]
fn every_test_is_registered() {
    let in_sources = tests_in_sources();
    let registered: BTreeSet<(String, String, bool)> = registered()
        .iter()
        .map(|t| {
            let module = t.module.split("::").nth(1).unwrap_or("main");
            (module.to_string(), t.name.to_string(), t.ignored)
        })
        .collect();
    let unregistered: Vec<_> = in_sources.difference(&registered).collect();
    let unknown: Vec<_> = registered.difference(&in_sources).collect();
    assert!(
        unregistered.is_empty() && unknown.is_empty(),
        "(module, test, ignored) in the sources but not registered: {unregistered:?}; registered but not found in the sources: {unknown:?}"
    );
    assert!(
        in_sources.len() > 100,
        "only {} tests found in tests/it/*.rs",
        in_sources.len()
    );
}

#[test]
fn parts_left_out_end_the_test_ignored() {
    assert_eq!(run_here(|| Ok(())), Ok(()));
    assert_eq!(run_here(|| skip("x missing")), skip("x missing"));
    assert_eq!(
        run_here(|| {
            assert_eq!(part(Ok::<u8, Skip>(1)), Some(1));
            assert_eq!(part(skip::<u8>("a missing")), None);
            assert_eq!(part(skip::<u8>("a missing")), None);
            assert_eq!(part(skip::<u8>("b missing")), None);
            Ok(())
        }),
        skip("parts left out: a missing; b missing")
    );
    assert_eq!(
        run_here(|| {
            part(skip::<u8>("a missing"));
            skip("x missing")
        }),
        skip("x missing; parts left out before: a missing")
    );
}

/// A test runs on a thread named after it; a panic there reaches libtest-mimic (which
/// fails the test with the message) with its payload. The panic below is printed by
/// the panic hook: it is this test's, on purpose.
#[test]
fn a_test_runs_on_its_own_named_thread_and_its_panic_is_passed_on() {
    let named = run("harness::named".into(), || {
        assert_eq!(std::thread::current().name(), Some("harness::named"));
        Ok(())
    });
    assert!(matches!(named, Ok(Completion::Completed)));
    let panicked = std::panic::catch_unwind(|| {
        run("harness::this panic is deliberate".into(), || {
            panic!("deliberate: {}", 42)
        })
    });
    let Err(payload) = panicked else {
        panic!("the panic is not passed on")
    };
    assert_eq!(
        payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied()),
        Some("deliberate: 42")
    );
}
