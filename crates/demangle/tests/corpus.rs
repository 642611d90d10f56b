//! The fast path against `cpp_demangle` on every kernel name of PyTorch 2.11's
//! `libtorch_cuda.so` (21,132 names, CUTLASS's and ATen's; `cudaw fatbin --json`, zstd in
//! `data/`), on mutations of them, and on names grown until both give up.

use cudaw_demangle::{demangle, fast, reference};
use fixture::torch_names;
use proptest::prelude::*;

mod fixture;

#[test]
fn every_torch_kernel_name_prints_as_cpp_demangle_prints_it() {
    let names = torch_names();
    assert_eq!(names.len(), 21_132);
    let mut fast_ones = 0;
    for name in &names {
        let reference = reference(name);
        if let Some(mine) = fast(name) {
            assert_eq!(Some(&mine), reference.as_ref(), "{name}");
            fast_ones += 1;
        }
        assert_eq!(demangle(name), reference.unwrap_or_else(|| name.clone()));
    }
    // The point of the fast path: nearly every name takes it (the rest are deeper than the
    // fast path follows, or use what it leaves to cpp_demangle).
    assert!(
        fast_ones * 100 >= names.len() * 95,
        "{fast_ones} of {} names took the fast path",
        names.len()
    );
}

/// Names that grow one level at a time, each shape until both sides refuse it: the fast
/// path must refuse first (or print what cpp_demangle prints), never print a name that
/// cpp_demangle cannot.
#[test]
fn the_fast_path_gives_up_no_later_than_cpp_demangle() {
    type Shape = fn(usize) -> String;
    let shapes: [(&str, Shape); 11] = [
        ("substitution templates", |k| {
            format!("_Z1a{}i{}", "SaI".repeat(k), "E".repeat(k))
        }),
        ("substitution templates of a parameter", |k| {
            format!("_Z1fIiEvS_I{}i{}E", "S_I".repeat(k), "E".repeat(k))
        }),
        ("templates", |k| {
            format!("_Z1fI{}i{}EvT_", "1AI".repeat(k), "E".repeat(k))
        }),
        ("two-argument templates", |k| {
            format!("_Z1fI{}i{}EvT_", "1AIi".repeat(k), "E".repeat(k))
        }),
        ("pointers", |k| format!("_Z1f{}i", "P".repeat(k))),
        ("const pointers", |k| format!("_Z1f{}i", "PK".repeat(k))),
        ("nested templates", |k| {
            format!("_Z1fI{}i{}EvT_", "N1a1bI".repeat(k), "EE".repeat(k))
        }),
        ("packs", |k| {
            format!("_Z1fI{}i{}EvT_", "1AIJ".repeat(k), "EE".repeat(k))
        }),
        ("local names", |k| {
            format!("_Z1fI{}UlvE_EvT_", "Z1gvE".repeat(k))
        }),
        ("lambdas in lambdas", |k| {
            format!("_Z{}1gv{}", "Z".repeat(k), "ENKUlvE_clEv".repeat(k))
        }),
        ("references to template arguments", |k| {
            format!("_Z1fI{}i{}EvPKT_", "N1a1bIRK".repeat(k), "EE".repeat(k))
        }),
    ];
    for (what, shape) in shapes {
        let mut fast_gave_up = false;
        for k in 1..200 {
            let name = shape(k);
            let (mine, theirs) = (fast(&name), reference(&name));
            if let Some(mine) = &mine {
                assert!(
                    !fast_gave_up,
                    "{what}: the fast path came back at {k} levels"
                );
                assert_eq!(Some(mine), theirs.as_ref(), "{what}, {k} levels: {name}");
            } else {
                fast_gave_up = true;
            }
            if theirs.is_none() {
                assert!(fast_gave_up, "{what}: {k} levels");
                break;
            }
        }
        assert!(fast_gave_up, "{what}: cpp_demangle never gave up");
    }
}

/// A real name changed at random: one byte dropped, replaced or inserted, a tail cut off,
/// or a piece repeated.
fn mutated() -> impl Strategy<Value = String> {
    let names = torch_names();
    let alphabet: &[u8] = b"0123456789_ENIJLKPRSTZUlvicbsjmDpaEt";
    (
        0..names.len(),
        any::<prop::sample::Index>(),
        any::<prop::sample::Index>(),
        0..5u8,
        0..alphabet.len(),
    )
        .prop_map(move |(n, at, len, op, c)| {
            let mut b = names[n].as_bytes().to_vec();
            let i = at.index(b.len());
            match op {
                0 => {
                    b.remove(i);
                }
                1 => b[i] = alphabet[c],
                2 => b.insert(i, alphabet[c]),
                3 => b.truncate(i.max(2)),
                _ => {
                    let end = (i + 1 + len.index(16)).min(b.len());
                    let piece = b[i..end].to_vec();
                    b.splice(i..i, piece);
                }
            }
            String::from_utf8_lossy(&b).into_owned()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn a_mutated_name_prints_as_cpp_demangle_prints_it_or_not_at_all(name in mutated()) {
        if let Some(mine) = fast(&name) {
            prop_assert_eq!(Some(mine), reference(&name), "{}", name);
        }
    }

    #[test]
    fn any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let name = format!("_Z{}", String::from_utf8_lossy(&bytes));
        if let Some(mine) = fast(&name) {
            prop_assert_eq!(Some(mine), reference(&name), "{}", name);
        }
    }
}
