//! The schema → flags mapping, through its public API: every rule of the issue and every error it
//! names, as tables of `(schema, args, expected)` run through one `check`.

use agentos_core::flagmap::{FlagSpec, FlagType, flag_table, kebab, validate};
use serde_json::{Value, json};

/// Parses `args` against `schema` and validates the result, as the caller does. `expected` is the
/// whole input on success, or a substring of the one-line error (a leading `^` anchors it to the start).
fn check(schema: &Value, args: &[&str], expected: Result<Value, &str>) {
    let table = flag_table(schema);
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let got = table.parse(&args).and_then(|input| validate(schema, &table, &input).map(|()| input));
    let ctx = format!("schema {schema}\nargs {args:?}");
    match (got, expected) {
        (Ok(got), Ok(want)) => assert_eq!(got, want, "{ctx}"),
        (Err(e), Err(want)) => {
            let msg = e.to_string();
            assert!(!msg.contains('\n') && !msg.contains('\r'), "{ctx}\nerror is not one line: {msg:?}");
            match want.strip_prefix('^') {
                Some(prefix) => assert!(msg.starts_with(prefix), "{ctx}\nerror {msg:?} does not start with {prefix:?}"),
                // A trailing `$`: the error ends so.
                None => match want.strip_suffix('$') {
                    Some(end) => assert!(msg.ends_with(end), "{ctx}\nerror {msg:?} does not end with {end:?}"),
                    None => assert!(msg.contains(want), "{ctx}\nerror {msg:?} does not contain {want:?}"),
                },
            }
        }
        (Ok(got), Err(want)) => panic!("{ctx}\nexpected an error containing {want:?}, got Ok({got})"),
        (Err(e), Ok(want)) => panic!("{ctx}\nexpected Ok({want}), got error {:?}", e.to_string()),
    }
}

/// One schema, many calls.
fn check_all(schema: &Value, cases: &[(&[&str], Result<Value, &str>)]) {
    for (args, expected) in cases {
        check(schema, args, expected.clone());
    }
}

/// The schema most cases share: one flag of every kind.
fn weather() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name"},
            "lat": {"type": "number"},
            "days": {"type": "integer"},
            "fullPage": {"type": "boolean"},
            "units": {"enum": ["metric", "imperial"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "scores": {"type": "array", "items": {"type": "number"}}
        },
        "required": ["city"]
    })
}

#[test]
fn strings() {
    check_all(
        &weather(),
        &[
            (&["--city", "Paris"], Ok(json!({"city": "Paris"}))),
            (&["--city=Paris"], Ok(json!({"city": "Paris"}))),
            (&["--city", "New York"], Ok(json!({"city": "New York"}))),
            // Only the first `=` splits.
            (&["--city=a=b"], Ok(json!({"city": "a=b"}))),
            (&["--city="], Ok(json!({"city": ""}))),
            (&["--city", ""], Ok(json!({"city": ""}))),
            // A single dash is a value; a string that looks like a number stays a string.
            (&["--city", "-x"], Ok(json!({"city": "-x"}))),
            (&["--city", "42"], Ok(json!({"city": "42"}))),
            // A value that starts with `--` must be attached with `=`.
            (&["--city=--x"], Ok(json!({"city": "--x"}))),
            // Given twice: the first would be dropped unseen (the last one won). The same value
            // twice is taken.
            (
                &["--city", "Paris", "--city", "Rome"],
                Err(
                    "^--city is given twice, with different values: it takes one value (only a list's flag repeats); give it once",
                ),
            ),
            (&["--city", "Paris", "--city=Paris"], Ok(json!({"city": "Paris"}))),
            (&["--city"], Err("^--city needs a value (<string>)")),
            (&["--city", "--days", "3"], Err("^--city needs a value (<string>)")),
        ],
    );
}

#[test]
fn numbers() {
    let s = json!({"type": "object", "properties": {"lat": {"type": "number"}}});
    check_all(
        &s,
        &[
            (&["--lat", "41.9"], Ok(json!({"lat": 41.9}))),
            // The same number twice, however written, is one value.
            (&["--lat", "1", "--lat", "1.0"], Ok(json!({"lat": 1.0}))),
            (&["--lat", "1", "--lat", "2"], Err("^--lat is given twice, with different values")),
            (&["--lat=41.9"], Ok(json!({"lat": 41.9}))),
            (&["--lat", "-41.9"], Ok(json!({"lat": -41.9}))),
            (&["--lat=-41.9"], Ok(json!({"lat": -41.9}))),
            (&["--lat", "-0.5"], Ok(json!({"lat": -0.5}))),
            (&["--lat", "1e3"], Ok(json!({"lat": 1000.0}))),
            // A whole number stays whole, as `--json '{"lat": 41}'` would give it.
            (&["--lat", "41"], Ok(json!({"lat": 41}))),
            (&["--lat", "-7"], Ok(json!({"lat": -7}))),
            (&["--lat", "abc"], Err(r#"^--lat: expected a number, got "abc""#)),
            (&["--lat", "41,9"], Err(r#"^--lat: expected a number, got "41,9""#)),
            (&["--lat", ""], Err("^--lat: expected a number")),
            (&["--lat", "inf"], Err(r#"^--lat: expected a finite number, got "inf""#)),
            (&["--lat", "-infinity"], Err("^--lat: expected a finite number")),
            (&["--lat", "NaN"], Err("^--lat: expected a finite number")),
            (&["--lat", "1e999"], Err("^--lat: expected a finite number")),
            (&["--lat"], Err("^--lat needs a value (<number>)")),
            (&["--lat", "--lat", "1"], Err("^--lat needs a value (<number>)")),
        ],
    );
}

#[test]
fn integers() {
    let s = json!({"type": "object", "properties": {"days": {"type": "integer"}}});
    check_all(
        &s,
        &[
            (&["--days", "3"], Ok(json!({"days": 3}))),
            (&["--days=3"], Ok(json!({"days": 3}))),
            (&["--days", "-3"], Ok(json!({"days": -3}))),
            (&["--days=-3"], Ok(json!({"days": -3}))),
            (&["--days", "0"], Ok(json!({"days": 0}))),
            (&["--days", "18446744073709551615"], Ok(json!({"days": u64::MAX}))),
            (
                &["--days", "18446744073709551616"],
                Err(
                    "^--days: 18446744073709551616 is out of range: integers go from -9223372036854775808 to 18446744073709551615",
                ),
            ),
            (&["--days", "-99999999999999999999"], Err("^--days: -99999999999999999999 is out of range")),
            (&["--days", "--99999999999999999999"], Err("^--days needs a value")),
            (&["--days", "3", "--"], Err("^`--` is not taken here: tools take flags only")),
            (&["--days", "three"], Err(r#"^--days: expected an integer, got "three""#)),
            (&["--days", "1.5"], Err(r#"^--days: expected an integer, got "1.5""#)),
            (&["--days", "-1.5"], Err(r#"^--days: expected an integer, got "-1.5""#)),
            (&["--days", "1e3"], Err("^--days: expected an integer")),
            (&["--days"], Err("^--days needs a value (<integer>)")),
            (&["--days", "--days", "3"], Err("^--days needs a value (<integer>)")),
        ],
    );
}

#[test]
fn booleans() {
    let s = json!({"type": "object", "properties": {"fullPage": {"type": "boolean"}, "city": {"type": "string"}}});
    check_all(
        &s,
        &[
            (&["--full-page"], Ok(json!({"fullPage": true}))),
            (&["--no-full-page"], Ok(json!({"fullPage": false}))),
            (&["--full-page=true"], Ok(json!({"fullPage": true}))),
            (&["--full-page=false"], Ok(json!({"fullPage": false}))),
            // Each undoes the other: one of the two is a mistake, as for text's `--no-x`.
            (
                &["--full-page", "--no-full-page"],
                Err("^--full-page and --no-full-page are both given: give one of them"),
            ),
            (&["--no-full-page", "--full-page=true"], Err("^--full-page and --no-full-page are both given")),
            // Two that agree are taken; two of one form that disagree are a flag given twice.
            (&["--full-page=false", "--no-full-page"], Ok(json!({"fullPage": false}))),
            (&["--full-page", "--full-page=false"], Err("^--full-page is given twice, with different values")),
            (&["--full-page", "--full-page"], Ok(json!({"fullPage": true}))),
            (&["--no-full-page", "--no-full-page"], Ok(json!({"fullPage": false}))),
            // A boolean takes no separate value: the next word is a positional argument.
            (&["--full-page", "false"], Err(r#"^unexpected argument "false""#)),
            (&["--full-page=yes"], Err(r#"^--full-page: expected true or false, got "yes""#)),
            (&["--no-full-page=true"], Err("^--no-full-page takes no value")),
            // `--no-` only negates booleans.
            (&["--no-city"], Err("^unknown flag --no-city")),
            (&["--no-such"], Err("^unknown flag --no-such")),
        ],
    );
    // A property whose own name starts with `no`.
    let s = json!({"type": "object", "properties": {"noCache": {"type": "boolean"}}});
    check_all(
        &s,
        &[(&["--no-cache"], Ok(json!({"noCache": true}))), (&["--no-no-cache"], Ok(json!({"noCache": false})))],
    );
}

#[test]
fn enums() {
    let s = json!({
        "type": "object",
        "properties": {
            "units": {"type": "string", "enum": ["metric", "imperial"]},
            "level": {"type": "integer", "enum": [1, 2, 3]},
            "mode": {"const": "fast"},
            "maybe": {"type": ["string", "null"], "enum": ["a", null]}
        }
    });
    check_all(
        &s,
        &[
            (&["--units", "metric"], Ok(json!({"units": "metric"}))),
            (&["--units=imperial"], Ok(json!({"units": "imperial"}))),
            (&["--units", "kelvin"], Err(r#"^--units: "kelvin" is not one of metric, imperial"#)),
            (&["--units", "Metric"], Err("metric, imperial")),
            (&["--units"], Err("^--units needs a value (<metric|imperial>)")),
            (&["--level", "2"], Ok(json!({"level": 2}))),
            (&["--level", "4"], Err(r#"^--level: "4" is not one of 1, 2, 3"#)),
            (&["--mode", "fast"], Ok(json!({"mode": "fast"}))),
            (&["--mode", "slow"], Err(r#"^--mode: "slow" is not one of fast"#)),
            (&["--maybe", "a"], Ok(json!({"maybe": "a"}))),
            (&["--maybe", "null"], Ok(json!({"maybe": null}))),
            (&["--maybe", "b"], Err("is not one of a, null")),
        ],
    );
    // Choices that are strings and also the JSON of other choices: each can be typed, and the
    // placeholder tells them apart. (`--e 1` gave the string "1", and the number had no flag.)
    let s = json!({"type": "object", "properties": {"e": {"enum": ["1", 1, "null", null, "true", true, "x"]}}});
    check_all(
        &s,
        &[
            (&["--e", "1"], Ok(json!({"e": 1}))),
            (&["--e", r#""1""#], Ok(json!({"e": "1"}))),
            (&["--e", "null"], Ok(json!({"e": null}))),
            (&["--e", r#""null""#], Ok(json!({"e": "null"}))),
            (&["--e", "true"], Ok(json!({"e": true}))),
            (&["--e", r#""true""#], Ok(json!({"e": "true"}))),
            (&["--e", "x"], Ok(json!({"e": "x"}))),
            (&["--e", "2"], Err(r#"^--e: "2" is not one of "1", 1, "null", null, "true", true, x"#)),
        ],
    );
    // A string that holds quotes is its own text; the one without is typed bare or quoted.
    let quoted = json!({"type": "object", "properties": {"q": {"enum": ["\"a\"", "a", "line\nbreak"]}}});
    check_all(
        &quoted,
        &[
            (&["--q", r#""a""#], Ok(json!({"q": "\"a\""}))),
            (&["--q", "a"], Ok(json!({"q": "a"}))),
            (&["--q", "b"], Err(r#"^--q: "b" is not one of "a", a, line\nbreak"#)),
        ],
    );
    let shown = flag_table(&s).flags[0].placeholder();
    assert_eq!(shown, r#"<"1"|1|"null"|null|"true"|true|x>"#);
    // Required with one allowed value: given by default, and still refused when wrong.
    let s = json!({"type": "object", "required": ["type", "name"], "properties": {
        "type": {"type": "string", "enum": ["realtime"]},
        "name": {"type": "string"}
    }});
    check_all(
        &s,
        &[
            (&["--name", "x"], Ok(json!({"type": "realtime", "name": "x"}))),
            (&["--name", "x", "--type", "batch"], Err(r#"^--type: "batch" is not one of realtime"#)),
        ],
    );
    assert!(!flag_table(&s).flags.iter().find(|f| f.flag == "type").unwrap().required);
}

#[test]
fn arrays() {
    let s = json!({
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}},
            "scores": {"type": "array", "items": {"type": "number"}},
            "ids": {"type": "array", "items": {"type": "integer"}},
            "flags": {"type": "array", "items": {"type": "boolean"}},
            "colors": {"type": "array", "items": {"enum": ["red", "green"]}},
            "points": {"type": "array", "items": {"type": "object"}},
            "short": {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 2},
            "anything": {"type": "array"}
        }
    });
    check_all(
        &s,
        &[
            (&["--tags", "a"], Ok(json!({"tags": ["a"]}))),
            (&["--tags", "a", "--tags", "b"], Ok(json!({"tags": ["a", "b"]}))),
            (&["--tags=a", "--tags", "b", "--tags=c"], Ok(json!({"tags": ["a", "b", "c"]}))),
            // String items stay strings.
            (&["--tags", "1", "--tags", "true"], Ok(json!({"tags": ["1", "true"]}))),
            (&["--scores", "1", "--scores", "2.5"], Ok(json!({"scores": [1, 2.5]}))),
            (&["--scores", "-1", "--scores=-2.5"], Ok(json!({"scores": [-1, -2.5]}))),
            (&["--scores", "x"], Err(r#"^--scores: expected a number, got "x""#)),
            (&["--scores", "1", "--scores"], Err("^--scores needs a value (<number>...)")),
            (&["--ids", "1", "--ids", "2"], Ok(json!({"ids": [1, 2]}))),
            (&["--ids", "1", "--ids", "1.5"], Err(r#"^--ids: expected an integer, got "1.5""#)),
            (&["--flags", "true", "--flags", "false"], Ok(json!({"flags": [true, false]}))),
            (&["--flags", "yes"], Err(r#"^--flags: expected true or false, got "yes""#)),
            (&["--colors", "red", "--colors", "green"], Ok(json!({"colors": ["red", "green"]}))),
            (&["--colors", "puce"], Err(r#"^--colors: "puce" is not one of red, green"#)),
            (&["--points", r#"{"x":1}"#, "--points", r#"{"x":2}"#], Ok(json!({"points": [{"x": 1}, {"x": 2}]}))),
            // Item-level and array-level schema rules are checked after mapping, and name the flag.
            (&["--short", "abcd", "--short", "ab"], Err(r#"^--short: "abcd" is longer than 3 characters"#)),
            (&["--short", "ab"], Err("^--short: ")),
            (&["--short", "ab", "--short", "cd"], Ok(json!({"short": ["ab", "cd"]}))),
            (&["--points", "1"], Err("^--points: 1 is not of type \"object\"")),
            (&["--anything", "1", "--anything", "x"], Ok(json!({"anything": [1, "x"]}))),
        ],
    );
}

#[test]
fn optional_fields_and_required_fields() {
    let s = weather();
    check_all(
        &s,
        &[
            // Every optional field omitted: nothing invented.
            (&["--city", "Paris"], Ok(json!({"city": "Paris"}))),
            (&[], Err("^Missing required flag: --city")),
            (&["--days", "3"], Err("^Missing required flag: --city")),
            // `--json` can supply a required field.
            (&["--json", r#"{"city":"Rome"}"#], Ok(json!({"city": "Rome"}))),
        ],
    );
}

#[test]
fn defaults() {
    let s = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "default": 3},
            "fullPage": {"type": "boolean", "default": false},
            "tags": {"type": "array", "items": {"type": "string"}, "default": ["x"]},
            "units": {"enum": ["metric", "imperial"], "default": "metric"}
        },
        // A field with a default is never required.
        "required": ["city", "days", "units"]
    });
    check_all(
        &s,
        &[
            (
                &["--city", "Paris"],
                Ok(json!({"city": "Paris", "days": 3, "fullPage": false, "tags": ["x"], "units": "metric"})),
            ),
            (
                &["--city", "Paris", "--days", "5", "--full-page", "--tags", "y", "--units", "imperial"],
                Ok(json!({"city": "Paris", "days": 5, "fullPage": true, "tags": ["y"], "units": "imperial"})),
            ),
            // `--json` counts as given: its values are not overwritten by defaults.
            (
                &["--json", r#"{"city":"Rome","days":9}"#],
                Ok(json!({"city": "Rome", "days": 9, "fullPage": false, "tags": ["x"], "units": "metric"})),
            ),
            (&[], Err("^Missing required flag: --city")),
        ],
    );
}

/// Regression: an object's own default was never used, so a required object with one failed as
/// missing although `--help` showed all its flags as optional.
#[test]
fn an_object_with_a_default_gets_it_where_its_parent_is() {
    let schema = json!({"type": "object", "required": ["where"], "properties": {
        "where": {"type": "object", "default": {"lat": 1.5}, "required": ["lat"], "properties": {
            "lat": {"type": "number"}, "lon": {"type": "number", "default": 0}}},
        "opt": {"type": "object", "properties": {"inner": {"type": "object", "default": {"a": "x"},
            "properties": {"a": {"type": "string"}}}}}}});
    check_all(
        &schema,
        &[
            (&[], Ok(json!({"where": {"lat": 1.5, "lon": 0}}))),
            // Given in part, it is the caller's: a default stands for a value left out.
            (&["--where.lon", "3"], Err("--where.lat: \"lat\" is a required property")),
            (&["--where.lat", "2"], Ok(json!({"where": {"lat": 2, "lon": 0}}))),
            // Inside an optional object that is not given, nothing is conjured up.
            (&["--json", r#"{"opt": {}}"#], Ok(json!({"where": {"lat": 1.5, "lon": 0}, "opt": {"inner": {"a": "x"}}}))),
        ],
    );
}

/// Regressions: a list of booleans showed no value in its usage (`--bools ...`) though each
/// needs one; `--count-file` for an integer flag was an unknown flag, with nothing to go on.
#[test]
fn a_list_of_booleans_shows_its_values_and_a_file_for_a_number_is_refused_saying_why() {
    let schema = json!({"type": "object", "properties": {
        "bools": {"type": "array", "items": {"type": "boolean"}}, "count": {"type": "integer"}}});
    let table = flag_table(&schema);
    let bools = table.flags.iter().find(|f| f.flag == "bools").unwrap();
    assert_eq!(bools.ty.placeholder(), "<true|false>...");
    check_all(
        &schema,
        &[
            (&["--bools", "true", "--bools", "false"], Ok(json!({"bools": [true, false]}))),
            (
                &["--count-file", "n.txt"],
                Err("--count-file: only a string flag reads its value from a file; --count takes <integer>"),
            ),
        ],
    );
}

/// Regression: a property named `eq=x` got the flag `--eq=x`, which reads as `--eq` given `x`,
/// and one named "" got `--`: shown in `--help`, neither could be typed.
#[test]
fn a_property_whose_name_cannot_be_typed_gets_a_flag_that_can() {
    let schema = json!({"type": "object", "properties": {
        "eq=x": {"type": "string"}, "": {"type": "string"}, "two\nlines": {"type": "integer"}, "eq-x": {"type": "string"}}});
    let flags: Vec<String> = flag_table(&schema).flags.iter().map(|f| f.flag.clone()).collect();
    for f in &flags {
        assert!(!f.is_empty() && !f.contains(['=', '\n']), "{flags:?}");
    }
    check_all(
        &schema,
        &[
            (&["--eq-x", "a"], Ok(json!({"eq-x": "a"}))),
            (
                &["--eq-x-2", "b", "--value", "c", "--two-lines", "3"],
                Ok(json!({"eq=x": "b", "": "c", "two\nlines": 3})),
            ),
        ],
    );
}

#[test]
fn camel_case_properties_become_kebab_flags() {
    let s = json!({
        "type": "object",
        "properties": {
            "fullPageURL": {"type": "string"},
            "maxResults": {"type": "integer"},
            "snake_case": {"type": "boolean"},
            "page2Url": {"type": "string"}
        }
    });
    check_all(
        &s,
        &[
            (&["--full-page-url", "https://x.test"], Ok(json!({"fullPageURL": "https://x.test"}))),
            (&["--max-results", "10"], Ok(json!({"maxResults": 10}))),
            (&["--snake-case"], Ok(json!({"snake_case": true}))),
            (&["--no-snake-case"], Ok(json!({"snake_case": false}))),
            (&["--page2-url", "u"], Ok(json!({"page2Url": "u"}))),
            // The property's own spelling is not a flag, but it points at the one that is.
            (&["--fullPageURL", "x"], Err("^unknown flag --fullPageURL; did you mean --full-page-url?")),
            (&["--maxResults", "1"], Err("did you mean --max-results?")),
            (&["--snake_case"], Err("did you mean --snake-case?")),
        ],
    );
}

#[test]
fn properties_spelled_alike_or_as_a_tool_s_own_flag_each_get_a_flag_they_can_be_set_by() {
    let s = json!({
        "type": "object",
        "properties": {
            "foo-bar": {"type": "string"},
            "fooBar": {"type": "string"},
            "foo_bar": {"type": "string"},
            "help": {"type": "string"},
            "json": {"type": "string"},
            "b": {"type": "boolean"},
            "noB": {"type": "string"},
            "where": {"type": "object", "properties": {"a-b": {"type": "string"}, "aB": {"type": "string"}}}
        }
    });
    let flags: Vec<String> = flag_table(&s).flags.iter().map(|f| f.flag.clone()).collect();
    let unique: std::collections::BTreeSet<&String> = flags.iter().collect();
    assert_eq!(unique.len(), flags.len(), "{flags:?}");
    check_all(
        &s,
        &[
            (&["--foo-bar", "1"], Ok(json!({"foo-bar": "1"}))),
            (&["--fooBar", "2"], Ok(json!({"fooBar": "2"}))),
            (&["--foo_bar", "3"], Ok(json!({"foo_bar": "3"}))),
            (&["--help-2", "h"], Ok(json!({"help": "h"}))),
            (&["--json-2", "j"], Ok(json!({"json": "j"}))),
            (&["--no-b"], Ok(json!({"b": false}))),
            (&["--noB", "x"], Ok(json!({"noB": "x"}))),
            (&["--where.a-b", "1", "--where.aB", "2"], Ok(json!({"where": {"a-b": "1", "aB": "2"}}))),
        ],
    );
    // A flag that collides with nothing keeps its name, whatever another is renamed to.
    let s = json!({"type": "object", "properties": {"help": {"type": "string"}, "help-2": {"type": "string"}}});
    check_all(
        &s,
        &[(&["--help-2", "two"], Ok(json!({"help-2": "two"}))), (&["--help-3", "one"], Ok(json!({"help": "one"})))],
    );
}

#[test]
fn unknown_flags_and_positional_arguments() {
    let s = weather();
    check_all(
        &s,
        &[
            (&["--cty", "Paris"], Err("^unknown flag --cty; did you mean --city?")),
            (&["--city", "Paris", "--dys", "3"], Err("^unknown flag --dys; did you mean --days?")),
            (&["--fullpage"], Err("did you mean --full-page?")),
            (&["--unit=metric"], Err("^unknown flag --unit; did you mean --units?")),
            (&["--jsn", "{}"], Err("did you mean --json?")),
            (&["--city", "Paris", "--completely-unrelated-thing"], Err("^unknown flag --completely-unrelated-thing")),
            // Positional arguments, wherever they appear.
            (&["Paris"], Err(r#"^unexpected argument "Paris": tools take flags only"#)),
            (&["--city", "Paris", "Rome"], Err(r#"^unexpected argument "Rome""#)),
            (&["-c", "Paris"], Err(r#"^unexpected argument "-c""#)),
            (&["-5"], Err(r#"^unexpected argument "-5""#)),
            // `--json-file` is the caller's: it never reaches the parser.
            (&["--json-file", "in.json"], Err("^--json-file must be read by the caller")),
            (&["--json-file=in.json"], Err("^--json-file must be read by the caller")),
            // A flag name with a line break still gives a one-line error.
            (&["--ci\nty", "Paris"], Err("^unknown flag --ci\\nty")),
        ],
    );
    // A far-off name gets no suggestion, and a name is never suggested to itself (`--help` is
    // the caller's to answer before parsing).
    let table = flag_table(&s);
    for arg in ["--completely-unrelated-thing", "--help"] {
        let err = table.parse(&[arg.to_string()]).unwrap_err().to_string();
        assert_eq!(err, format!("unknown flag {arg}"));
    }
}

#[test]
fn empty_schemas() {
    for s in [json!({}), json!({"type": "object"}), json!({"type": "object", "properties": {}})] {
        assert!(flag_table(&s).flags.is_empty(), "{s}");
        check_all(
            &s,
            &[
                (&[], Ok(json!({}))),
                (&["--x", "1"], Err("^unknown flag --x")),
                (&["--city=Paris"], Err("^unknown flag --city")),
                (&["Paris"], Err("^unexpected argument")),
                (&["--json", r#"{"a":1,"b":[true]}"#], Ok(json!({"a": 1, "b": [true]}))),
                (&["--json={}"], Ok(json!({}))),
            ],
        );
    }
}

#[test]
fn nested_objects_use_dotted_flags() {
    let s = json!({
        "type": "object",
        "properties": {
            "where": {
                "type": "object",
                "properties": {
                    "lat": {"type": "number"},
                    "lon": {"type": "number"},
                    "placeName": {"type": "string"}
                },
                "required": ["lat"]
            },
            "near": {
                "type": "object",
                "properties": {
                    "lat": {"type": "number"},
                    "lon": {"type": "number"},
                    "radius": {"type": "integer", "default": 10, "minimum": 1}
                },
                "required": ["lat", "lon"]
            },
            "a": {"type": "object", "properties": {"b": {"type": "object", "properties": {"cDepth": {"type": "integer"}}}}}
        },
        "required": ["where"]
    });
    check_all(
        &s,
        &[
            (&["--where.lat", "41.9"], Ok(json!({"where": {"lat": 41.9}}))),
            (
                &["--where.lat=41.9", "--where.lon", "-12.5", "--where.place-name", "Rome"],
                Ok(json!({"where": {"lat": 41.9, "lon": -12.5, "placeName": "Rome"}})),
            ),
            (&["--where.lat", "-41.9"], Ok(json!({"where": {"lat": -41.9}}))),
            (&["--where.lat", "1", "--a.b.c-depth", "3"], Ok(json!({"where": {"lat": 1}, "a": {"b": {"cDepth": 3}}}))),
            // A required field inside a required object is a required flag.
            (&[], Err("^Missing required flag: --where.lat")),
            (&["--where.lon", "2"], Err("^Missing required flag: --where.lat")),
            (&["--where.lat", "north"], Err(r#"^--where.lat: expected a number, got "north""#)),
            (&["--where.lat"], Err("^--where.lat needs a value (<number>)")),
            // The object itself is not a flag.
            (&["--where", r#"{"lat":1}"#], Err("^unknown flag --where; did you mean --where.lat?")),
            (&["--where.latt", "1"], Err("^unknown flag --where.latt; did you mean --where.lat?")),
            // An optional object is left out when none of its flags is given: its defaults do not
            // conjure it up (its own required fields would then fail).
            (&["--where.lat", "1"], Ok(json!({"where": {"lat": 1}}))),
            // Given, it gets its defaults and its required fields are checked, naming the flag.
            (
                &["--where.lat", "1", "--near.lat", "2", "--near.lon", "3"],
                Ok(json!({"where": {"lat": 1}, "near": {"lat": 2, "lon": 3, "radius": 10}})),
            ),
            (&["--where.lat", "1", "--near.lat", "2"], Err(r#"^--near.lon: "lon" is a required property"#)),
            (
                &["--where.lat", "1", "--near.lat", "2", "--near.lon", "3", "--near.radius", "0"],
                Err("^--near.radius: "),
            ),
            // `--json` can fill part of an object and flags the rest.
            (
                &["--json", r#"{"where":{"lat":5,"lon":6}}"#, "--where.lon", "7"],
                Ok(json!({"where": {"lat": 5, "lon": 7}})),
            ),
        ],
    );
    // A required object whose fields all have defaults is filled in.
    let s = json!({
        "type": "object",
        "properties": {"opts": {"type": "object", "properties": {"n": {"type": "integer", "default": 1}}}},
        "required": ["opts"]
    });
    check_all(&s, &[(&[], Ok(json!({"opts": {"n": 1}}))), (&["--opts.n", "2"], Ok(json!({"opts": {"n": 2}})))]);
}

#[test]
fn nullable_types() {
    let s = json!({
        "type": "object",
        "properties": {
            "note": {"type": ["string", "null"]},
            "count": {"type": ["null", "integer"]},
            "ratio": {"type": ["number", "null"], "maximum": 1},
            "strict": {"type": ["boolean", "null"]},
            "plain": {"type": "integer"},
            "ids": {"type": ["array", "null"], "items": {"type": "integer"}}
        }
    });
    check_all(
        &s,
        &[
            (&["--note", "hi"], Ok(json!({"note": "hi"}))),
            // Text is text: a nullable string's null is --no-note (or --json).
            (&["--note", "null"], Ok(json!({"note": "null"}))),
            (&["--no-note"], Ok(json!({"note": null}))),
            (&["--no-note=x"], Err("^--no-note takes no value (it sends null)")),
            (
                &["--no-note", "--note", "x"],
                Err("^--note and --no-note are both given: --no-note sends null; give one of them"),
            ),
            (&["--note", "x", "--no-note"], Err("^--note and --no-note are both given")),
            (&["--no-note", "--note-file", "/dev/null"], Err("^--note and --no-note are both given")),
            (&["--no-ids"], Ok(json!({"ids": null}))),
            (&["--ids", "1", "--no-ids"], Err("^--ids and --no-ids are both given")),
            // Only a flag that may be null has the form.
            (&["--no-plain"], Err("^unknown flag --no-plain")),
            (&["--no-count"], Err("^unknown flag --no-count")),
            (&["--count", "5"], Ok(json!({"count": 5}))),
            (&["--count", "null"], Ok(json!({"count": null}))),
            (&["--count=null"], Ok(json!({"count": null}))),
            (&["--count", "five"], Err(r#"^--count: expected an integer, or null, got "five""#)),
            (&["--ratio", "0.5"], Ok(json!({"ratio": 0.5}))),
            (&["--ratio", "null"], Ok(json!({"ratio": null}))),
            (&["--ratio", "2.5"], Err("^--ratio: 2.5 is greater than the maximum of 1")),
            (&["--strict"], Ok(json!({"strict": true}))),
            (&["--no-strict"], Ok(json!({"strict": false}))),
            (&["--strict=null"], Ok(json!({"strict": null}))),
            (&["--strict=maybe"], Err(r#"^--strict: expected true or false, or null, got "maybe""#)),
            // A flag whose type has no null does not take one.
            (&["--plain", "null"], Err(r#"^--plain: expected an integer, got "null""#)),
            (&["--ids", "1", "--ids", "2"], Ok(json!({"ids": [1, 2]}))),
            (&["--json", r#"{"note":null,"count":null}"#], Ok(json!({"note": null, "count": null}))),
        ],
    );
    let table = flag_table(&s);
    let shown = |flag: &str| table.flags.iter().find(|f| f.flag == flag).unwrap().placeholder();
    assert_eq!(shown("count"), "<integer|null>");
    assert_eq!(shown("ratio"), "<number|null>");
    assert_eq!(shown("strict"), "<true|false|null>");
    assert_eq!(shown("note"), "<string>");
    assert_eq!(shown("plain"), "<integer>");
    let null_form = |flag: &str| table.flags.iter().find(|f| f.flag == flag).unwrap().null_form;
    assert!(null_form("note") && null_form("ids"));
    assert!(!null_form("count") && !null_form("strict") && !null_form("plain"));
}

/// A property spelled as another's null form (`no-note` beside a nullable `note`) is renamed,
/// as one spelled as a boolean's false form is: each can still be set.
#[test]
fn a_property_spelled_as_a_null_form_keeps_a_flag_of_its_own() {
    let s = json!({"type": "object", "properties": {
        "note": {"type": ["string", "null"]},
        "no-note": {"type": "string"}
    }});
    let table = flag_table(&s);
    let flags: Vec<&str> = table.flags.iter().map(|f| f.flag.as_str()).collect();
    assert!(flags.contains(&"note") && !flags.contains(&"no-note"), "{flags:?}");
    let other = table.flags.iter().find(|f| f.path == ["no-note"]).unwrap().flag.clone();
    check(&s, &["--no-note"], Ok(json!({"note": null})));
    check(&s, &[&format!("--{other}"), "x"], Ok(json!({"no-note": "x"})));
}

#[test]
fn json_valued_flags() {
    let s = json!({
        "type": "object",
        "properties": {
            "meta": {"type": "object"},
            "extra": {"type": "object", "properties": {}},
            "any": {},
            "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]}
        }
    });
    check_all(
        &s,
        &[
            (&["--meta", r#"{"a":1,"b":{"c":[1,2]}}"#], Ok(json!({"meta": {"a": 1, "b": {"c": [1, 2]}}}))),
            (&["--meta={}"], Ok(json!({"meta": {}}))),
            (&["--extra", r#"{"k":"v"}"#], Ok(json!({"extra": {"k": "v"}}))),
            (&["--meta", "[1]"], Err(r#"^--meta: [1] is not of type "object""#)),
            (&["--meta", "not json"], Err(r#"^--meta: "not json" is not of type "object""#)),
            (&["--meta"], Err("^--meta needs a value (<json>)")),
            (&["--any", "hello"], Ok(json!({"any": "hello"}))),
            (&["--any", "5"], Ok(json!({"any": 5}))),
            (&["--any", "[true]"], Ok(json!({"any": [true]}))),
            (&["--either", "x"], Ok(json!({"either": "x"}))),
            (&["--either", "7"], Ok(json!({"either": 7}))),
            // As `type: [string, integer]` reads it: JSON of neither type is the text.
            (&["--either", "1.5"], Ok(json!({"either": "1.5"}))),
        ],
    );
}

#[test]
fn json_flag() {
    let s = weather();
    check_all(
        &s,
        &[
            (&["--json", r#"{"city":"Rome","days":5}"#], Ok(json!({"city": "Rome", "days": 5}))),
            (&[r#"--json={"city":"Rome"}"#], Ok(json!({"city": "Rome"}))),
            // Flags win over `--json`, wherever it stands.
            (&["--json", r#"{"city":"Rome","days":5}"#, "--city", "Paris"], Ok(json!({"city": "Paris", "days": 5}))),
            (&["--city", "Paris", "--json", r#"{"city":"Rome","days":5}"#], Ok(json!({"city": "Paris", "days": 5}))),
            (
                &["--json", r#"{"city":"Rome","fullPage":true}"#, "--no-full-page"],
                Ok(json!({"city": "Rome", "fullPage": false})),
            ),
            // A repeated flag replaces the list `--json` gave.
            (&["--json", r#"{"city":"Rome","tags":["x"]}"#, "--tags", "y"], Ok(json!({"city": "Rome", "tags": ["y"]}))),
            (&["--tags", "y", "--json", r#"{"city":"Rome","tags":["x"]}"#], Ok(json!({"city": "Rome", "tags": ["y"]}))),
            // Two `--json`: the later one wins key by key.
            (
                &["--json", r#"{"city":"Rome","days":1}"#, "--json", r#"{"days":2}"#],
                Ok(json!({"city": "Rome", "days": 2})),
            ),
            // `--json` is validated too, and errors name the flag for the field.
            (&["--json", r#"{"city":"Rome","days":"three"}"#], Err(r#"^--days: "three" is not of type "integer""#)),
            (&["--json", r#"{"city":"Rome","tags":["a",2]}"#], Err(r#"^--tags: 2 is not of type "string""#)),
            (&["--json", r#"{"city":"Rome","unitz":"metric"}"#], Ok(json!({"city": "Rome", "unitz": "metric"}))),
            (&["--json"], Err("^--json needs a value: a JSON object")),
            (&["--json", "--city", "Paris"], Err("^--json: not valid JSON")),
            (&["--json", "{nope"], Err("^--json: not valid JSON")),
            (
                &["--json", "-"],
                Err("^--json takes the JSON text itself; to read it from standard input use --json-file -"),
            ),
            (&["--json=-"], Err("use --json-file -")),
            (&["--json", "[1,2]"], Err("^--json: expected a JSON object")),
            (&["--json", "\"city\""], Err("^--json: expected a JSON object")),
            (&["--json", "{\n\"city\": 1\n"], Err("^--json: not valid JSON")),
        ],
    );
}

#[test]
fn schema_errors_name_the_flag() {
    let s = json!({
        "type": "object",
        "properties": {
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "city": {"type": "string", "maxLength": 5, "pattern": "^[A-Z]"},
            "where": {"type": "object", "properties": {"lat": {"type": "number", "minimum": -90}}},
            "a/b": {"type": "integer", "minimum": 0}
        },
        "additionalProperties": false
    });
    check_all(
        &s,
        &[
            (&["--days", "0"], Err("^--days: 0 is less than the minimum of 1")),
            (&["--days", "15"], Err("^--days: 15 is greater than the maximum of 14")),
            (&["--days=-1"], Err("^--days: -1 is less than the minimum of 1")),
            (&["--city", "Barcelona"], Err(r#"^--city: "Barcelona" is longer than 5 characters"#)),
            (&["--city", "rome"], Err(r#"^--city: "rome" does not match"#)),
            (&["--where.lat", "-91"], Err("^--where.lat: -91 is less than the minimum of -90")),
            (&["--a/b", "-1"], Err("^--a/b: -1 is less than the minimum of 0")),
            // Nothing to name: the whole input.
            (
                &["--json", r#"{"bogus":1}"#],
                Err("^input: Additional properties are not allowed ('bogus' was unexpected)"),
            ),
            (&["--json", "{\"a\\nb\":1}"], Err("^input: Additional properties are not allowed")),
            // A near name is named, as the input spells it.
            (
                &["--json", r#"{"Days":1}"#],
                Err(r#"^input: Additional properties are not allowed ('Days' was unexpected); did you mean "days"?"#),
            ),
            // None for a name far from every property, or for one the input sets already.
            (&["--json", r#"{"url":1}"#], Err("was unexpected)$")),
            (&["--json", r#"{"days":1,"Days":2}"#], Err("('Days' was unexpected)$")),
            (&["--days", "3", "--city", "Rome"], Ok(json!({"days": 3, "city": "Rome"}))),
        ],
    );

    // `validate` on its own, for inputs that did not come from flags.
    let table = flag_table(&s);
    let items = json!({"type": "object", "properties": {"ids": {"type": "array", "items": {"type": "integer"}}}});
    let cases: &[(&Value, Value, Result<(), &str>)] = &[
        (&s, json!({"days": 3}), Ok(())),
        (&s, json!({"days": 0}), Err("--days: 0 is less than the minimum of 1")),
        (&s, json!({"city": "Amsterdam"}), Err(r#"--city: "Amsterdam" is longer than 5 characters"#)),
        (&s, json!({"where": {"lat": -100}}), Err("--where.lat: -100 is less than the minimum of -90")),
        (&s, json!({"where": 5}), Err(r#"input at /where: 5 is not of type "object""#)),
        (&items, json!({"ids": [1, "x"]}), Err(r#"--ids: "x" is not of type "integer""#)),
        (&items, json!({"ids": [1, 2.5]}), Err(r#"--ids: 2.5 is not of type "integer""#)),
        (&items, json!({"ids": "1"}), Err(r#"--ids: "1" is not of type "array""#)),
        (&items, json!([]), Err(r#"input: [] is not of type "object""#)),
    ];
    for (schema, input, want) in cases {
        let table = if std::ptr::eq(*schema, &s) { table.clone() } else { flag_table(schema) };
        let got = validate(schema, &table, input).map_err(|e| e.to_string());
        assert_eq!(got, want.map_err(str::to_string), "{input}");
    }
    // A schema the validator cannot read is not the caller's fault.
    let broken = json!({"type": "object", "properties": {"x": {"type": "no-such-type"}}});
    assert_eq!(validate(&broken, &flag_table(&broken), &json!({"x": 1})), Ok(()));
}

#[test]
fn everything_at_once() {
    let s = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "lat": {"type": "number"},
            "days": {"type": "integer", "minimum": 1, "default": 3},
            "fullPageURL": {"type": "boolean"},
            "units": {"enum": ["metric", "imperial"], "default": "metric"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "scores": {"type": "array", "items": {"type": "number"}},
            "note": {"type": ["string", "null"]},
            "meta": {"type": "object"},
            "where": {
                "type": "object",
                "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}, "zoom": {"type": "integer", "default": 5}},
                "required": ["lat", "lon"]
            }
        },
        "required": ["city", "where"]
    });
    check(
        &s,
        &[
            "--json",
            r#"{"note":"from json","city":"Rome","lat":1}"#,
            "--city=Paris",
            "--lat",
            "-41.9",
            "--full-page-url",
            "--tags",
            "a",
            "--scores=1",
            "--tags",
            "b",
            "--scores",
            "-2.5",
            "--meta",
            r#"{"k":[1]}"#,
            "--where.lat",
            "48.8",
            "--where.lon=-2.3",
        ],
        Ok(json!({
            "city": "Paris",
            "lat": -41.9,
            "days": 3,
            "fullPageURL": true,
            "units": "metric",
            "tags": ["a", "b"],
            "scores": [1, -2.5],
            "note": "from json",
            "meta": {"k": [1]},
            "where": {"lat": 48.8, "lon": -2.3, "zoom": 5}
        })),
    );
    check(&s, &["--city", "Paris", "--where.lat", "1", "--where.lon", "2", "--days", "0"], Err("^--days: "));
    check(&s, &["--city", "Paris", "--where.lat", "1"], Err("^Missing required flag: --where.lon"));
}

#[test]
fn table_shape() {
    let s = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name"},
            "days": {"type": "integer", "default": 3},
            "tags": {"type": "array", "items": {"type": "string"}},
            "where": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]},
            "opt": {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]}
        },
        "required": ["city", "days", "where"]
    });
    let table = flag_table(&s);
    let mut names: Vec<&str> = table.flags.iter().map(|f| f.flag.as_str()).collect();
    names.sort();
    assert_eq!(names, ["city", "days", "opt.x", "tags", "where.lat"]);
    let spec = |flag: &str, path: &[&str], ty: FlagType, required: bool, default: Option<Value>, description: &str| {
        let want = FlagSpec {
            flag: flag.to_string(),
            path: path.iter().map(|p| p.to_string()).collect(),
            ty,
            required,
            default,
            description: description.to_string(),
            binary: false,
            base64: false,
            nullable: false,
            null_form: false,
            json_types: Vec::new(),
        };
        assert_eq!(table.flags.iter().find(|f| f.flag == flag), Some(&want));
    };
    spec("city", &["city"], FlagType::String, true, None, "City name");
    // In `required`, but with a default: not a required flag.
    spec("days", &["days"], FlagType::Integer, false, Some(json!(3)), "");
    spec("tags", &["tags"], FlagType::Array(Box::new(FlagType::String)), false, None, "");
    spec("where.lat", &["where", "lat"], FlagType::Number, true, None, "");
    // Required inside an optional object: not a required flag.
    spec("opt.x", &["opt", "x"], FlagType::Boolean, false, None, "");
}

#[test]
fn kebab_cases() {
    let cases = [
        ("fullPageURL", "full-page-url"),
        ("URLParser", "url-parser"),
        ("getHTTPResponse", "get-http-response"),
        ("userID", "user-id"),
        ("ID", "id"),
        ("snake_case", "snake-case"),
        ("SCREAMING_SNAKE", "screaming-snake"),
        ("camel_Case", "camel-case"),
        ("simple", "simple"),
        ("already-kebab", "already-kebab"),
        ("Capitalized", "capitalized"),
        ("page2Url", "page2-url"),
        ("page2url", "page2url"),
        ("HTTP2Server", "http2-server"),
        ("x", "x"),
        ("", ""),
        ("with space", "with-space"),
    ];
    for (name, want) in cases {
        assert_eq!(kebab(name), want, "kebab({name:?})");
    }
}

#[test]
fn placeholders() {
    let cases = [
        (FlagType::String, "<string>"),
        (FlagType::Number, "<number>"),
        (FlagType::Integer, "<integer>"),
        (FlagType::Boolean, ""),
        (FlagType::Json, "<json>"),
        (FlagType::Enum(vec![json!("metric"), json!("imperial")]), "<metric|imperial>"),
        (FlagType::Enum(vec![json!(1), json!(2.5), json!(null)]), "<1|2.5|null>"),
        (FlagType::Array(Box::new(FlagType::String)), "<string>..."),
        (FlagType::Array(Box::new(FlagType::Number)), "<number>..."),
        (FlagType::Array(Box::new(FlagType::Enum(vec![json!("a"), json!("b")]))), "<a|b>..."),
        (FlagType::Array(Box::new(FlagType::Json)), "<json>..."),
        // A registrant's text is inert, a string's or an object's (whose JSON keeps a
        // bidirectional override raw): it reaches `--help` and the prompt.
        (FlagType::Enum(vec![json!("a\u{202e}b"), json!({"k": "\u{202e}v"})]), r#"<a\u{202e}b|{"k":"\u{202e}v"}>"#),
    ];
    for (ty, want) in cases {
        assert_eq!(ty.placeholder(), want, "{ty:?}");
    }
    // The table chooses those types from the schema.
    let s = json!({"type": "object", "properties": {
        "a": {"type": "array", "items": {"type": "integer"}},
        "b": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}},
        "c": {"type": "array"},
        "d": {"const": 7},
        "e": {"type": ["boolean", "null"]}
    }});
    let table = flag_table(&s);
    let ty = |n: &str| table.flags.iter().find(|f| f.flag == n).unwrap().ty.placeholder();
    assert_eq!([ty("a"), ty("b"), ty("c"), ty("d"), ty("e")], ["<integer>...", "<json>...", "<json>...", "<7>", ""]);
}

/// `--x-file PATH`: the shell command reads the file and sends it marked with its path; the
/// parser makes it the value of `--x` (text, or a data URL for a binary field), or the path when
/// the tool has a flag `--x-file` of its own. Unmarked, over the API, it is refused.
#[test]
fn a_file_flag_gives_a_string_flag_its_file_s_text_or_bytes() {
    use agentos_core::flagmap::{DataUrl, mark_file};
    let s = json!({"type": "object", "properties": {
        "note": {"type": "string"},
        "photo": {"type": "string", "format": "binary"},
        "outputFile": {"type": "string"},
        "count": {"type": "integer"}
    }});
    let table = flag_table(&s);
    let text = mark_file("n.txt", Ok(DataUrl::encode("text/plain", Some("n.txt"), "héllo\n".as_bytes())));
    let bytes = DataUrl::encode("image/png", Some("p.png"), &[0, 255, 1]);
    let args = |a: &[&str]| a.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let v = table
        .parse(&args(&[
            "--note-file",
            &text,
            &format!("--photo-file={}", mark_file("p.png", Ok(bytes.clone()))),
            "--output-file",
            &mark_file("out/report.txt", Err("No such file or directory (os error 2)".into())),
        ]))
        .unwrap();
    assert_eq!(v, json!({"note": "héllo\n", "photo": bytes, "outputFile": "out/report.txt"}));
    let err = |a: &[&str]| table.parse(&args(a)).unwrap_err().0;
    let binary = mark_file("p.png", Ok(DataUrl::encode("image/png", None, &[0, 255])));
    assert_eq!(err(&["--note-file", &binary]), "--note-file p.png: not UTF-8 text, and --note takes text, not bytes");
    let gone = mark_file("gone.txt", Err("No such file or directory (os error 2)".into()));
    assert_eq!(err(&["--note-file", &gone]), "--note-file gone.txt: No such file or directory (os error 2)");
    assert!(
        err(&["--note-file", "/etc/passwd"]).contains("takes a path that the agentos-<toolkit> shell command reads")
    );
    // Only string flags take a file.
    assert!(err(&["--count-file", &text]).starts_with("--count-file: only a string flag reads its value from a file"));
    // What the shell command asks before it reads a file, or takes `-h` for a value: a flag of
    // the tool's own named `x-file` reads nothing; a boolean takes no value.
    let file_of = |name: &str| table.file_flag(name).map(|f| f.flag.as_str());
    assert_eq!(
        [file_of("note-file"), file_of("photo-file"), file_of("output-file"), file_of("count-file"), file_of("note")],
        [Some("note"), Some("photo"), None, None, None]
    );
    let b = flag_table(&json!({"type": "object", "properties": {"v": {"type": "boolean"}, "n": {"type": "string"}}}));
    let takes = ["v", "no-v", "n", "n-file", "nope"].map(|f| b.takes_value(f));
    assert_eq!(takes, [false, false, true, true, false]);
    assert!(table.takes_value("output-file") && table.takes_value("count"));

    // A base64 string (`format: byte`) takes any file, sent encoded.
    let b64 = flag_table(&json!({"type": "object", "properties": {
        "data": {"type": "string", "format": "byte"},
        "blob": {"type": "string", "contentEncoding": "base64"}}}));
    let v = b64.parse(&args(&["--data-file", &binary, "--blob-file", &text])).unwrap();
    assert_eq!(v, json!({"data": "AP8=", "blob": "aMOpbGxvCg=="}));
}

#[test]
fn a_flag_of_several_types_takes_a_value_of_each() {
    let table = flag_table(&json!({"type": "object", "properties": {
        "num": {"type": ["integer", "string"]}, "maybe": {"type": ["string", "null"]}}}));
    let args = |a: &[&str]| a.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(table.parse(&args(&["--num", "5"])).unwrap(), json!({"num": 5}));
    assert_eq!(table.parse(&args(&["--num", "abc"])).unwrap(), json!({"num": "abc"}));
    // One type beside null stays that type: text is text.
    assert_eq!(table.parse(&args(&["--maybe", "5"])).unwrap(), json!({"maybe": "5"}));
    // JSON of a type the flag does not take is the text as typed, when text is one it takes.
    for word in ["true", "null", "[1]", "{}", "1.5"] {
        assert_eq!(table.parse(&args(&["--num", word])).unwrap(), json!({"num": word}), "{word}");
    }
    // A number JSON would not keep as typed stays the text.
    let big = "123456789012345678901234567890";
    assert_eq!(table.parse(&args(&["--num", big])).unwrap(), json!({"num": big}));
    assert_eq!(table.parse(&args(&["--num", "-7"])).unwrap(), json!({"num": -7}));
    // Without text among them, the JSON stays, for the schema to refuse by its types.
    let table = flag_table(&json!({"type": "object", "properties": {"n": {"type": ["integer", "boolean"]}}}));
    assert_eq!(table.parse(&args(&["--n", "true"])).unwrap(), json!({"n": true}));
    assert_eq!(table.parse(&args(&["--n", "7"])).unwrap(), json!({"n": 7}));
    assert_eq!(table.parse(&args(&["--n", "1.5"])).unwrap(), json!({"n": 1.5}));
    // `null` among them: null.
    let table = flag_table(&json!({"type": "object", "properties": {"n": {"type": ["integer", "string", "null"]}}}));
    assert_eq!(table.parse(&args(&["--n", "null"])).unwrap(), json!({"n": null}));
    assert_eq!(table.parse(&args(&["--n", "false"])).unwrap(), json!({"n": "false"}));
}

/// What Pydantic writes for `Optional[…]` and `Union[…]` (`anyOf` of typed schemas, no type of
/// its own) gets the flag the same field written with a list of types would: text stays text,
/// a number a number, `null` null where the type could not mean it otherwise. Each was a
/// `<json>` flag, and `--name 123` sent a number to a field of text.
#[test]
fn a_flag_of_any_of_typed_schemas_takes_the_types_listed() {
    let table = flag_table(&json!({"type": "object", "properties": {
        "name": {"anyOf": [{"type": "string", "maxLength": 10}, {"type": "null"}], "title": "Name", "description": "Who."},
        "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": null},
        "id": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
        "either": {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]},
        "color": {"anyOf": [{"enum": ["red", "blue"], "type": "string"}, {"type": "null"}]},
        "tags": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
        "where": {"anyOf": [{"type": "object", "properties": {"lat": {"type": "number"}}}, {"type": "null"}]},
        "shape": {"anyOf": [{"type": "object", "properties": {"a": {"type": "string"}}}, {"type": "string"}]},
        "ids": {"type": "array", "items": {"type": ["integer", "string"]}},
        "names": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
        "code": {"anyOf": [{"type": ["integer", "string"]}, {"type": "null"}]},
        "labels": {"anyOf": [{"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, {"type": "null"}]}
    }}));
    let spec =
        |f: &str| table.flags.iter().find(|s| s.flag == f).unwrap_or_else(|| panic!("no --{f}: {table:?}")).clone();
    let args = |a: &[&str]| a.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(spec("name").ty, FlagType::String);
    assert_eq!(spec("name").description, "Who.", "the property's own words first");
    assert_eq!(table.parse(&args(&["--name", "123"])).unwrap()["name"], json!("123"));
    assert_eq!(table.parse(&args(&["--name", "true"])).unwrap()["name"], json!("true"));
    // `Optional[str]`'s null, and `Optional[List[str]]`'s.
    assert_eq!(table.parse(&args(&["--no-name"])).unwrap()["name"], json!(null));
    assert_eq!(table.parse(&args(&["--no-tags"])).unwrap()["tags"], json!(null));
    assert_eq!(spec("limit").ty, FlagType::Integer);
    assert_eq!(spec("limit").placeholder(), "<integer|null>");
    assert_eq!(table.parse(&args(&["--limit", "5"])).unwrap()["limit"], json!(5));
    assert_eq!(table.parse(&args(&["--limit", "null"])).unwrap()["limit"], json!(null));
    let refused = table.parse(&args(&["--limit", "five"])).unwrap_err().0;
    assert!(refused.contains("--limit") && refused.contains("integer"), "{refused}");
    // Several scalar types: as `type: [integer, string]` is read.
    assert_eq!(spec("id").json_types, ["integer", "string"]);
    assert_eq!(spec("id").placeholder(), "<integer|string>", "its types, not <json>");
    assert_eq!(spec("either").placeholder(), "<integer|string|null>");
    assert_eq!(spec("ids").placeholder(), "<integer|string>...");
    assert_eq!(table.parse(&args(&["--id", "7"])).unwrap()["id"], json!(7));
    assert_eq!(table.parse(&args(&["--id", "true"])).unwrap()["id"], json!("true"));
    assert_eq!(table.parse(&args(&["--either", "null"])).unwrap()["either"], json!(null));
    assert_eq!(table.parse(&args(&["--either", "x"])).unwrap()["either"], json!("x"));
    // An enum beside null takes null among its choices.
    assert!(matches!(&spec("color").ty, FlagType::Enum(c) if c.contains(&json!(null)) && c.contains(&json!("red"))));
    assert_eq!(table.parse(&args(&["--color", "blue"])).unwrap()["color"], json!("blue"));
    // A list beside null is a repeated flag; an object beside null keeps its fields' flags.
    assert_eq!(table.parse(&args(&["--tags", "a", "--tags", "b"])).unwrap()["tags"], json!(["a", "b"]));
    assert_eq!(table.parse(&args(&["--where.lat", "41.5"])).unwrap()["where"], json!({"lat": 41.5}));
    // Anything richer stays JSON.
    assert_eq!(spec("shape").ty, FlagType::Json);
    // A list's items are read the same way.
    let ids = table.parse(&args(&["--ids", "5", "--ids", "abc", "--ids", "true"])).unwrap();
    assert_eq!(ids["ids"], json!([5, "abc", "true"]));
    assert_eq!(spec("names").ty, FlagType::Array(Box::new(FlagType::String)));
    assert_eq!(table.parse(&args(&["--names", "123"])).unwrap()["names"], json!(["123"]));
    // A list of types beside null takes null too.
    assert_eq!(table.parse(&args(&["--code", "null"])).unwrap()["code"], json!(null));
    assert_eq!(table.parse(&args(&["--code", "x1"])).unwrap()["code"], json!("x1"));
    // `Optional[List[Optional[str]]]`: each item text.
    assert_eq!(spec("labels").ty, FlagType::Array(Box::new(FlagType::String)));
    assert_eq!(table.parse(&args(&["--labels", "7"])).unwrap()["labels"], json!(["7"]));
    // `Optional[Literal["fast"]]`, required: a choice of the value or null, not filled in.
    let table = flag_table(&json!({"type": "object", "required": ["mode"], "properties": {
        "mode": {"anyOf": [{"const": "fast", "type": "string"}, {"type": "null", "title": "None"}]}}}));
    assert!(table.flags[0].required, "{table:?}");
    assert_eq!(table.flags[0].ty, FlagType::Enum(vec![json!("fast"), json!(null)]));
    assert_eq!(table.parse(&args(&["--mode", "null"])).unwrap()["mode"], json!(null));
    assert!(table.parse(&args(&[])).unwrap_err().0.contains("--mode"));
}

/// A value refused by the one branch of an `anyOf` it could be (the other is null) is told why
/// that branch refused it, by the flag, not that no branch took it.
#[test]
fn a_value_refused_by_its_one_branch_of_any_of_is_told_that_branchs_reason() {
    let s = json!({"type": "object", "properties": {
        "score": {"anyOf": [{"type": "integer", "maximum": 10}, {"type": "null"}]},
        "sub": {"anyOf": [{"type": "object", "required": ["x"],
            "properties": {"x": {"type": "string"}, "y": {"type": "string"}}}, {"type": "null"}]},
        "either": {"anyOf": [{"type": "integer", "maximum": 3}, {"type": "string", "maxLength": 2}]},
        "both": {"anyOf": [{"type": "integer", "maximum": 3}, {"type": "integer", "multipleOf": 2}]}
    }});
    check_all(
        &s,
        &[
            (&["--score", "11"], Err("^--score: 11 is greater than the maximum of 10")),
            (&["--score", "null"], Ok(json!({"score": null}))),
            (&["--sub.y", "hi"], Err(r#"^--sub.x: "x" is a required property"#)),
            (&["--sub.x", "a"], Ok(json!({"sub": {"x": "a"}}))),
            // A value of one branch's type, refused by it.
            (&["--either", "5"], Err("^--either: 5 is greater than the maximum of 3")),
            (&["--either", "abc"], Err(r#"^--either: "abc" is longer than 2 characters"#)),
            // Two branches each refuse it for more than its type: neither stands out.
            (&["--both", "5"], Err("^--both: 5 is not valid under any of the schemas listed in the 'anyOf' keyword")),
        ],
    );
}

/// An input given as JSON gets the defaults flags get, each of them, whatever else it lacks;
/// a required field under an object given as null is not asked for.
#[test]
fn json_input_gets_every_default_and_a_null_object_asks_for_nothing_inside() {
    let s = json!({"type": "object", "required": ["a", "where"], "properties": {
        "a": {"type": "string"},
        "b": {"type": "integer", "default": 1},
        "where": {"type": ["object", "null"], "required": ["lat"], "properties": {
            "lat": {"type": "number"}, "unit": {"type": "string", "default": "deg"}}}
    }});
    let table = flag_table(&s);
    let filled = table.with_defaults(serde_json::Map::new());
    // A required object's defaults belong in it, as for flags.
    let want = json!({"b": 1, "where": {"unit": "deg"}});
    assert_eq!(Value::Object(filled), want, "a default past a missing field is filled in");
    let given = json!({"a": "x", "where": {"lat": 1.5}}).as_object().unwrap().clone();
    assert_eq!(
        Value::Object(table.with_defaults(given)),
        json!({"a": "x", "b": 1, "where": {"lat": 1.5, "unit": "deg"}})
    );
    check(&s, &["--a", "x", "--json", r#"{"where": null}"#], Ok(json!({"a": "x", "b": 1, "where": null})));
    check(&s, &["--a", "x"], Err("Missing required flag: --where.lat"));
}

/// An object that may be null (`Optional[SubModel]`, `nullable`) takes `--no-x` for null, which
/// none of its fields' flags can say; beside one of them it is refused, either way round.
#[test]
fn an_object_that_may_be_null_takes_no_x_for_null() {
    let s = json!({"type": "object", "required": ["where"], "properties": {
        "a": {"type": "string"},
        "where": {"type": ["object", "null"], "required": ["lat"], "properties": {
            "lat": {"type": "number"}, "unit": {"type": "string", "default": "deg"},
            "inner": {"anyOf": [{"type": "object", "properties": {"k": {"type": "string"}}}, {"type": "null"}]}}},
        "fixed": {"type": "object", "properties": {"x": {"type": "integer"}}}
    }});
    check(&s, &["--no-where"], Ok(json!({"where": null})));
    check(&s, &["--a", "b", "--no-where", "--no-where"], Ok(json!({"a": "b", "where": null})));
    // Flags win over `--json`, as for every other flag.
    check(&s, &["--json", r#"{"where": {"lat": 1}}"#, "--no-where"], Ok(json!({"where": null})));
    check(
        &s,
        &["--where.lat", "1", "--no-where.inner"],
        Ok(json!({"where": {"lat": 1, "unit": "deg", "inner": null}})),
    );
    let both =
        "--where.lat and --no-where are both given: --no-where sends null for the whole of where; give one of them";
    check(&s, &["--where.lat", "1", "--no-where"], Err(both));
    check(&s, &["--no-where", "--where.lat", "1"], Err(both));
    check(&s, &["--no-where", "--where.inner.k", "v"], Err("--where.inner.k and --no-where are both given"));
    check(&s, &["--no-where=1"], Err("--no-where takes no value (it sends null)"));
    // Inside it, a field or an object given as null: refused in either order too.
    let inner = "--no-where.inner and --no-where are both given";
    check(&s, &["--no-where.inner", "--no-where"], Err(inner));
    check(&s, &["--no-where", "--no-where.inner"], Err(inner));
    // An object that may not be null has no such flag.
    check(&s, &["--no-where", "--no-fixed"], Err("unknown flag --no-fixed"));

    // A flag already spelled so keeps it: the object's null goes through `--json` then.
    let taken = json!({"type": "object", "properties": {
        "no-where": {"type": "string"},
        "where": {"type": ["object", "null"], "properties": {"lat": {"type": "number"}}}
    }});
    check(&taken, &["--no-where", "x"], Ok(json!({"no-where": "x"})));
    let table = flag_table(&taken);
    assert_eq!(table.null_objects().count(), 0);
    // Also a flag renamed to the object's name (a boolean `where=` cannot be typed: `--where`,
    // `--no-where`), and a second object of the same spelling.
    let renamed = json!({"type": "object", "properties": {
        "where": {"type": ["object", "null"], "properties": {"lat": {"type": "number"}}},
        "where=": {"type": "boolean"}
    }});
    check(&renamed, &["--no-where"], Ok(json!({"where=": false})));
    assert_eq!(flag_table(&renamed).null_objects().count(), 0);
    let twins = json!({"type": "object", "properties": {
        "fooBar": {"type": ["object", "null"], "properties": {"a": {"type": "string"}}},
        "foo_bar": {"type": ["object", "null"], "properties": {"b": {"type": "string"}}}
    }});
    assert_eq!(flag_table(&twins).null_objects().count(), 1, "one --no-foo-bar");

    // `--help` lists it after the fields' flags, and an example given null is written with it.
    let op = agentos_core::entry::Operation {
        description: String::new(),
        input: s.clone(),
        output: None,
        examples: vec![agentos_core::entry::Example { description: "nowhere".into(), input: json!({"where": null}) }],
    };
    let help = agentos_core::toolhelp::tool_help("geo", "find", &op);
    assert!(help.contains("  --no-where "), "{help}");
    assert!(help.contains("where as null, instead of its fields' flags"), "{help}");
    assert!(help.contains("--no-where.inner"), "{help}");
    assert!(help.contains("agentos-geo find --no-where\n"), "{help}");
}
