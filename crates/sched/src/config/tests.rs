use super::*;

fn err(text: &str) -> String {
    Config::parse(text).unwrap_err().to_string()
}

#[test]
fn scratch() {
    for t in [
        "quantum = \"50ms\"\nfoo = 1\n",
        "[[job]]\nid = \"a\"\nbogus = 2\n",
        "[[job]]\nrequest = 0.5\n\n[[job]]\nid = \"b\"\n",
        "job = 3\n",
        "quantum = \n",
        "[default]\nrequest = \"x\"\n",
    ] {
        println!("{t:?} => {}", err(t));
    }
}
