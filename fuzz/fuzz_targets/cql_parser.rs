//! Arbitrary text -> the CQL parser. Must return a statement or a syntax error, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = sluice_cql::parse(text);
    }
});
