use super::*;

fn err(text: &str) -> String {
    Config::parse(text).unwrap_err().to_string()
}

const FULL: &str = r#"
quantum = "40ms"
min_quantum = "0.01s"
max_quantum = "1s"

[default]
request = 0.0
limit = 0.9
priority = 1

[[job]]
id = "train-a"
request = 0.25
limit = 0.5
memory = "8G"
priority = 10
gpus = ["GPU-1234", 1]

[[job]]
id = "train-b"
request = 0.75
memory = "75%"

[[job]]
id = "c"
memory = 1048576

[[job]]
id = "d"
memory = "1.5GiB"
"#;

#[test]
fn a_full_file_is_read() {
    let c = Config::parse(FULL).expect("valid");
    assert_eq!(c.quantum, Duration::from_millis(40));
    assert_eq!(c.min_quantum, Duration::from_millis(10));
    assert_eq!(c.max_quantum, Duration::from_secs(1));
    assert_eq!(c.default.limit, 0.9);
    assert_eq!(c.default.priority, 1);
    assert_eq!(
        c.jobs[0],
        JobSpec {
            id: "train-a".into(),
            request: 0.25,
            limit: 0.5,
            memory: Some(MemSpec::Bytes(8 << 30)),
            priority: 10,
            gpus: Some(vec!["GPU-1234".into(), "1".into()]),
        }
    );
    // What a job leaves out comes from [default].
    assert_eq!(c.jobs[1].limit, 0.9);
    assert_eq!(c.jobs[1].priority, 1);
    assert_eq!(c.jobs[1].memory, Some(MemSpec::Fraction(0.75)));
    assert_eq!(c.jobs[2].memory, Some(MemSpec::Bytes(1 << 20)));
    assert_eq!(c.jobs[3].memory, Some(MemSpec::Bytes(3 << 29)));
    assert_eq!(c.job("other").limit, 0.9);
    assert_eq!(c.job("other").id, "other");
}

#[test]
fn an_empty_file_is_the_default() {
    assert_eq!(Config::parse("").expect("valid"), Config::default());
    assert_eq!(
        Config::parse("# nothing\n").expect("valid"),
        Config::default()
    );
}

#[test]
fn unknown_keys_are_refused_with_their_line() {
    assert_eq!(
        err("quantum = \"50ms\"\nquantom = \"1s\"\n"),
        "line 2: unknown field `quantom`, expected one of `quantum`, `min_quantum`, \
         `max_quantum`, `default`, `job`"
    );
    assert_eq!(
        err("[[job]]\nid = \"a\"\nreqest = 0.5\n"),
        "line 3: unknown field `reqest`, expected one of `id`, `request`, `limit`, \
         `memory`, `priority`, `gpus`"
    );
}

#[test]
fn shares_outside_0_to_1_are_refused() {
    assert_eq!(
        err("[[job]]\nid = \"a\"\nrequest = 1.5\n"),
        "line 3: job \"a\": request 1.5 is out of range; expected a share of the GPU's time \
         from 0 to 1 (0.25 is a quarter)"
    );
    assert_eq!(
        err("[[job]]\nid = \"a\"\nlimit = -0.1\n"),
        "line 3: job \"a\": limit -0.1 is out of range; expected a share of the GPU's time \
         from 0 to 1 (0.25 is a quarter)"
    );
    assert_eq!(
        err("[default]\nrequest = \"half\"\n"),
        "line 2: default: request \"half\" is not a number; expected a share of the GPU's \
         time from 0 to 1 (0.25 is a quarter)"
    );
}

#[test]
fn a_limit_below_the_request_is_refused() {
    assert_eq!(
        err("[[job]]\nid = \"a\"\nrequest = 0.5\nlimit = 0.25\n"),
        "line 4: job \"a\": limit 0.25 is below request 0.5; expected a limit of at least \
         the request"
    );
    // The limit from [default]: the request's line.
    assert_eq!(
        err("[default]\nlimit = 0.2\n\n[[job]]\nid = \"a\"\nrequest = 0.5\n"),
        "line 6: job \"a\": limit 0.2 (from [default]) is below request 0.5; expected a \
         limit of at least the request"
    );
}

#[test]
fn requests_summing_over_1_are_refused_at_the_job_that_tips_them() {
    assert_eq!(
        err("[[job]]\nid = \"a\"\nrequest = 0.6\n\n[[job]]\nid = \"b\"\nrequest = 0.5\n"),
        "line 7: job \"b\": request 0.5 brings the jobs' requests to 1.1; expected the \
         requests of all jobs to sum to at most 1"
    );
    // Exactly 1 is fine.
    Config::parse("[[job]]\nid = \"a\"\nrequest = 0.25\n[[job]]\nid = \"b\"\nrequest = 0.75\n")
        .expect("valid");
}

#[test]
fn duplicate_ids_are_refused() {
    assert_eq!(
        err("[[job]]\nid = \"a\"\n\n[[job]]\nid = \"a\"\n"),
        "line 5: job #2: id \"a\" is already the id of job #1; expected each job's id once"
    );
}

#[test]
fn a_job_without_an_id_is_refused() {
    assert_eq!(
        err("[[job]]\nid = \"a\"\n\n[[job]]\nrequest = 0.5\n"),
        "line 4: job #2: no id; expected id = \"NAME\" (the name given to `cudaw run --job \
         NAME`)"
    );
    assert_eq!(
        err("[[job]]\nid = \"\"\n"),
        "line 2: job #1: id \"\" is not a name; expected a non-empty string without \
         surrounding spaces"
    );
    assert_eq!(
        err("[default]\nid = \"x\"\n"),
        "line 2: default.id: \"x\" given; expected no id in [default] (it applies to every \
         job not listed)"
    );
}

#[test]
fn bad_memory_is_refused() {
    let expected = |v: &str| {
        format!(
            "line 3: job \"a\": memory {v} is not a size; expected bytes (an integer), a size \
             such as \"8G\", \"512M\" or \"1.5GiB\" (binary units K, M, G, T), or a \
             percentage of the card such as \"75%\", more than 0 and at most 100%"
        )
    };
    for v in [
        "\"8X\"", "\"lots\"", "\"150%\"", "\"0%\"", "0", "-5", "\"G\"", "1.5",
    ] {
        assert_eq!(
            err(&format!("[[job]]\nid = \"a\"\nmemory = {v}\n")),
            expected(v),
            "{v}"
        );
    }
}

#[test]
fn bad_quanta_are_refused() {
    assert_eq!(
        err("min_quantum = \"300ms\"\n"),
        "line 1: min_quantum 300ms is longer than max_quantum 200ms; expected min_quantum \
         at most max_quantum"
    );
    assert_eq!(
        err("quantum = \"1s\"\n"),
        "line 1: quantum 1s is outside min_quantum..max_quantum (10ms..200ms); expected a \
         quantum within them (set min_quantum / max_quantum too)"
    );
    assert_eq!(
        err("\n\nquantum = 50\n"),
        "line 3: quantum: 50 is not a duration; expected a duration with a unit such as \
         \"50ms\", \"0.2s\" or \"1s\", more than 0"
    );
    assert_eq!(
        err("quantum = \"0ms\"\n"),
        "line 1: quantum: \"0ms\" is not a duration; expected a duration with a unit such \
         as \"50ms\", \"0.2s\" or \"1s\", more than 0"
    );
}

#[test]
fn bad_priorities_and_gpus_are_refused() {
    assert_eq!(
        err("[[job]]\nid = \"a\"\npriority = 1.5\n"),
        "line 3: job \"a\": priority 1.5 is not an integer; expected a whole number from \
         -2147483648 to 2147483647 (higher is swapped out later)"
    );
    assert_eq!(
        err("[[job]]\nid = \"a\"\ngpus = \"0\"\n"),
        "line 3: job \"a\": gpus \"0\" is not a list of GPUs; expected a list of UUIDs or \
         indexes such as [\"GPU-8e0c…\", 1]"
    );
}

#[test]
fn toml_syntax_errors_have_their_line() {
    let e = Config::parse("quantum = \"50ms\"\n[[job]\n").unwrap_err();
    assert_eq!(e.line, 2, "{e}");
}

#[test]
fn durations_and_sizes() {
    use super::parse::{parse_duration, parse_size};
    assert_eq!(parse_duration("50ms"), Some(Duration::from_millis(50)));
    assert_eq!(parse_duration("0.2s"), Some(Duration::from_millis(200)));
    assert_eq!(parse_duration("1s"), Some(Duration::from_secs(1)));
    assert_eq!(parse_duration("500us"), Some(Duration::from_micros(500)));
    assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
    assert_eq!(parse_duration("50"), None);
    assert_eq!(parse_duration("ms"), None);
    assert_eq!(parse_size("8G"), Some(8 << 30));
    assert_eq!(parse_size("512M"), Some(512 << 20));
    assert_eq!(parse_size("1.5GiB"), Some(3 << 29));
    assert_eq!(parse_size("64kB"), Some(64 << 10));
    assert_eq!(parse_size("4096"), Some(4096));
    assert_eq!(parse_size("99999999999T"), None);
}
