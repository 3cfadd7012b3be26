//! Prints what a document imports to, as the catalog would store it: every operation, or the one
//! tool named.
//!
//!   cargo run -p agentos-openapi --example import_dump -- FILE [TOOL]

use agentos_openapi::{ImportOptions, import};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(file) = args.first() else {
        eprintln!("usage: import_dump FILE [TOOL]");
        std::process::exit(2);
    };
    let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{file}: {e}"));
    match import(&bytes, &ImportOptions::default()) {
        Ok(imported) => match args.get(1) {
            Some(tool) => {
                let op =
                    imported.operations.iter().find(|o| &o.name == tool).unwrap_or_else(|| panic!("no tool {tool}"));
                println!("{}", serde_json::to_string_pretty(op).expect("serializes"));
            }
            None => {
                for op in &imported.operations {
                    println!("{} {} {}", op.name, op.method, op.path);
                }
                for s in &imported.skipped {
                    println!("skipped {}: {}", s.pointer, s.reason);
                }
                println!("security: {}", serde_json::to_string(&imported.security).expect("serializes"));
            }
        },
        Err(e) => {
            eprintln!("refused: {e}");
            std::process::exit(1);
        }
    }
}
