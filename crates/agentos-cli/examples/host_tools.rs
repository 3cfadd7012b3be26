//! An embedded master with a host toolkit: `weather` with `forecast` and `slow`. It shows how
//! whoever embeds agentos gives agents tools that run inside the master, with the master's
//! credentials. Run: `cargo run -p agentos-cli --bin host-tools-example -- --data DIR --listen ADDR`.

use std::path::PathBuf;
use std::time::Duration;

use agentos_engine::host::{HostContext, HostTool, HostToolkit};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ForecastInput {
    /// City name
    city: String,
    /// Number of days
    #[serde(default = "three")]
    days: u32,
    /// Report in Fahrenheit
    #[serde(default)]
    fahrenheit: bool,
}

fn three() -> u32 {
    3
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Day {
    day: u32,
    temperature: f64,
    condition: &'static str,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct PingInput {}

#[derive(Deserialize, JsonSchema)]
struct SlowInput {
    /// Seconds to wait
    #[serde(default)]
    seconds: u64,
}

fn weather() -> HostToolkit {
    HostToolkit::new("weather", "Weather data tools")
        .tool(
            HostTool::new(
                "forecast",
                "Get the weather forecast for a city",
                |input: ForecastInput, ctx: HostContext| async move {
                    // Stands in for a call to a weather service with a key only the master holds: the
                    // secret is read here and never reaches the agent.
                    let keyed = ctx.secret("WEATHER_KEY").is_some();
                    let base = 12.0 + (input.city.len() % 7) as f64;
                    let days: Vec<Day> = (1..=input.days.min(14))
                        .map(|d| {
                            let c = base + d as f64;
                            Day {
                                day: d,
                                temperature: if input.fahrenheit { c * 9.0 / 5.0 + 32.0 } else { c },
                                condition: ["sunny", "cloudy", "rain"][(d % 3) as usize],
                            }
                        })
                        .collect();
                    Ok::<_, String>(json!({"city": input.city, "days": days, "keyed": keyed}))
                },
            )
            .timeout(Duration::from_secs(5))
            .example("3-day forecast for Paris", json!({"city": "Paris", "days": 3})),
        )
        .tool(HostTool::new("ping", "Answer at once (the cheapest call there is)", |_: PingInput, _| async move {
            Ok::<_, String>(json!({"pong": true}))
        }))
        .tool(
            HostTool::new("slow", "Wait, then answer (for trying timeouts)", |input: SlowInput, _| async move {
                tokio::time::sleep(Duration::from_secs(input.seconds)).await;
                Ok::<_, String>(json!({"waited": input.seconds}))
            })
            .timeout(Duration::from_millis(500)),
        )
}

fn main() -> std::process::ExitCode {
    let mut data = PathBuf::from("./.agentos-example");
    let mut listen = "127.0.0.1:7421".to_string();
    // Like `agentos serve`, this master runs jq expressions in workers of its own program
    // (`ServeConfig::expressions`, by default): started as one, it is one.
    if let Some(code) = agentos_engine::sandbox::worker_if_asked() {
        return code;
    }
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--data" => data = args.next().map(PathBuf::from).unwrap_or(data),
            "--listen" => listen = args.next().unwrap_or(listen),
            other => {
                eprintln!("error: unknown argument {other:?} (use --data DIR --listen ADDR)");
                return std::process::ExitCode::from(2);
            }
        }
    }
    let config = agentos_server::ServeConfig {
        data_dir: data,
        listen,
        max_script_bytes: 1024 * 1024,
        max_body_bytes: 8 * 1024 * 1024,
        max_result_bytes: 64 * 1024 * 1024,
        snapshot_every: 10_000,
        jobs: Default::default(),
        dispatch: Default::default(),
        max_concurrent_invocations: 32,
        host_toolkits: vec![weather()],
        http_allow: Vec::new(),
        http_deny_private: false,
        mcp_endpoint: Default::default(),
        mcp: Default::default(),
        docker: Default::default(),
        loose_data_folder: agentos_server::LooseDataFolder::Refuse,
        connections: Default::default(),
        skip_events: Vec::new(),
        storage: Default::default(),
        net_limits: Default::default(),
        expressions: Default::default(),
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let result = rt.block_on(agentos_server::run(
        config,
        |ready| {
            println!("agentos master listening on {}", ready.url);
            println!("operator token: {}", ready.token_file.display());
        },
        shutdown,
    ));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
