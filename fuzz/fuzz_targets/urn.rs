//! Blob URN parsing never panics, and a parsed URN prints to a string that parses back to it.
#![no_main]

use agentos_core::urn::BlobUrn;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(urn) = s.parse::<BlobUrn>() {
        let printed = urn.to_string();
        let again = printed
            .parse::<BlobUrn>()
            .unwrap_or_else(|e| panic!("{s:?} parsed to {urn:?}, printed as {printed:?}, which does not parse: {e:?}"));
        assert_eq!(again, urn, "{s:?} printed as {printed:?} parses to another URN");
    }
});
