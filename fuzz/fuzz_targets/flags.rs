//! `Flags` parsing never panics, and a parsed value prints to a string that parses back to it.
#![no_main]

use agentos_core::flags::Flags;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(flags) = s.parse::<Flags>() {
        let printed = flags.to_string();
        let again = printed.parse::<Flags>().unwrap_or_else(|e| {
            panic!("{s:?} parsed to {flags:?}, printed as {printed:?}, which does not parse: {e:?}")
        });
        assert_eq!(again, flags, "{s:?} printed as {printed:?} parses to other flags");
        assert_eq!(again.to_string(), printed, "printing is not stable for {s:?}");
    }
});
