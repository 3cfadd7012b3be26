//! The rules of `build_request`: base URL joining, path escaping, query styles, headers and
//! cookies, each body encoding, and the input errors that name a flag.

use agentos_openapi::{CallError, ImportOptions, Operation, Request, build_request, import_value};
use serde_json::{Value, json};

/// The one operation of a document with `path` → `method` → `op`.
fn operation(path: &str, method: &str, op: Value) -> Operation {
    let d = json!({"openapi": "3.1.0", "info": {"title": "t", "version": "1"}, "paths": {path: {method: op}}});
    let mut i = import_value(&d, &ImportOptions::default()).unwrap_or_else(|e| panic!("refused: {e}"));
    assert_eq!(i.operations.len(), 1, "skipped: {:?}", i.skipped);
    i.operations.remove(0)
}

fn request(op: &Operation, input: Value) -> Request {
    build_request("https://api.example.com/v1/", op, &input).unwrap_or_else(|e| panic!("{input}: {e}"))
}

fn users() -> Operation {
    operation(
        "/users/{id}/files/{name}",
        "get",
        json!({"parameters": [
            {"name": "id", "in": "path", "required": true, "schema": {"type": "string"}},
            {"name": "name", "in": "path", "required": true, "schema": {"type": "string"}},
            {"name": "tags", "in": "query", "schema": {"type": "array", "items": {"type": "string"}}},
            {"name": "ids", "in": "query", "explode": false, "schema": {"type": "array", "items": {"type": "integer"}}},
            {"name": "pipes", "in": "query", "style": "pipeDelimited", "explode": false, "schema": {"type": "array"}},
            {"name": "metadata", "in": "query", "style": "deepObject", "schema": {"type": "object"}},
            {"name": "q", "in": "query", "schema": {"type": "string"}},
            {"name": "X-Trace", "in": "header", "schema": {"type": "string"}},
            {"name": "session", "in": "cookie", "schema": {"type": "string"}},
            {"name": "theme", "in": "cookie", "schema": {"type": "string"}}
        ]}),
    )
}

#[test]
fn path_values_are_escaped_one_segment_each() {
    let op = users();
    let cases = [
        (json!({"id": "42", "name": "a.txt"}), "https://api.example.com/v1/users/42/files/a.txt"),
        (json!({"id": "a/b c", "name": "x?y#z"}), "https://api.example.com/v1/users/a%2Fb%20c/files/x%3Fy%23z"),
        (json!({"id": "../admin", "name": "%2e%2e"}), "https://api.example.com/v1/users/..%2Fadmin/files/%252e%252e"),
        (json!({"id": 7, "name": true}), "https://api.example.com/v1/users/7/files/true"),
        (json!({"id": "é", "name": "n"}), "https://api.example.com/v1/users/%C3%A9/files/n"),
    ];
    for (input, url) in cases {
        assert_eq!(request(&op, input.clone()).url, url, "{input}");
    }
    for dots in [".", ".."] {
        let e = build_request("https://h", &op, &json!({"id": dots, "name": "n"})).unwrap_err();
        assert_eq!(
            e,
            CallError::BadValue { flag: "id".into(), reason: "a path parameter cannot be `.` or `..`".into() }
        );
    }
    let e = build_request("https://h", &op, &json!({"id": "", "name": "n"})).unwrap_err();
    assert!(matches!(e, CallError::BadValue { ref flag, .. } if flag == "id"), "{e}");
}

#[test]
fn query_parameters_follow_their_style() {
    let op = users();
    let base = json!({"id": "1", "name": "n"});
    let with = |extra: Value| {
        let mut input = base.clone();
        input.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        request(&op, input).url
    };
    let cases = [
        (json!({"tags": ["a", "b c"]}), "?tags=a&tags=b%20c"),
        (json!({"ids": [1, 2, 3]}), "?ids=1,2,3"),
        (json!({"pipes": ["a", "b"]}), "?pipes=a|b"),
        (json!({"metadata": {"k": "v", "n": {"m": 1}}}), "?metadata[k]=v&metadata[n][m]=1"),
        (json!({"q": "a&b=c"}), "?q=a%26b%3Dc"),
        (json!({"q": "x", "tags": ["t"]}), "?tags=t&q=x"),
    ];
    for (extra, query) in cases {
        assert_eq!(with(extra.clone()), format!("https://api.example.com/v1/users/1/files/n{query}"), "{extra}");
    }
}

#[test]
fn headers_and_cookies() {
    let op = users();
    let r = request(&op, json!({"id": "1", "name": "n", "x-trace": "t-1", "session": "a b;c", "theme": "dark"}));
    assert_eq!(
        r.headers,
        [
            ("X-Trace".to_string(), "t-1".to_string()),
            ("Cookie".to_string(), "session=a%20b%3Bc; theme=dark".to_string())
        ]
    );
    let e =
        build_request("https://h", &op, &json!({"id": "1", "name": "n", "x-trace": "a\r\nInjected: yes"})).unwrap_err();
    assert!(matches!(e, CallError::BadValue { ref flag, .. } if flag == "x-trace"), "{e}");
    // Any other control character is the caller's input to mend too, not a failure to send.
    for bad in ["a\u{1}b", "a\u{7f}b", "a\u{1b}[2J"] {
        let e = build_request("https://h", &op, &json!({"id": "1", "name": "n", "x-trace": bad})).unwrap_err();
        assert!(matches!(e, CallError::BadValue { ref flag, .. } if flag == "x-trace"), "{bad:?}: {e}");
    }
    let tab = build_request("https://h", &op, &json!({"id": "1", "name": "n", "x-trace": "a\tb"})).unwrap();
    assert!(tab.headers.iter().any(|(k, v)| k == "X-Trace" && v == "a\tb"));
}

#[test]
fn the_base_url_and_the_path_join_with_one_slash() {
    let op = operation("/pets", "get", json!({}));
    for (base, url) in [
        ("https://h", "https://h/pets"),
        ("https://h/", "https://h/pets"),
        ("https://h/api/v1", "https://h/api/v1/pets"),
        ("https://h/api/v1//", "https://h/api/v1/pets"),
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080/pets"),
    ] {
        assert_eq!(build_request(base, &op, &json!({})).unwrap().url, url, "{base}");
    }
    for base in ["h/api", "ftp://h", "https://", "https://h/?x=1"] {
        assert!(matches!(build_request(base, &op, &json!({})), Err(CallError::BaseUrl { .. })), "{base}");
    }
    // A fragment only told operations apart; a fixed query stays.
    let op = operation("/oauth2/token#refresh", "post", json!({}));
    assert_eq!(build_request("https://h", &op, &json!({})).unwrap().url, "https://h/oauth2/token");
}

#[test]
fn unknown_and_missing_flags_are_named() {
    let op = users();
    assert_eq!(
        build_request("https://h", &op, &json!({"id": "1", "name": "n", "colour": "red"})),
        Err(CallError::UnknownFlag { flag: "colour".into() })
    );
    let e = build_request("https://h", &op, &json!({"id": "1"})).unwrap_err();
    assert_eq!(e, CallError::MissingFlag { flag: "name".into() });
    assert_eq!(e.to_string(), "Missing required flag: --name");
    assert_eq!(build_request("https://h", &op, &json!([])), Err(CallError::NotAnObject));
}

fn body_op(media_type: &str, schema: Value) -> Operation {
    operation(
        "/items/{id}",
        "post",
        json!({
            "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
            "requestBody": {"required": true, "content": {media_type: {"schema": schema}}}
        }),
    )
}

#[test]
fn a_json_body_is_built_from_its_fields_by_their_document_names() {
    let op = body_op(
        "application/json",
        json!({"type": "object", "required": ["pageSize"], "properties": {
            "id": {"type": "string"}, "pageSize": {"type": "integer"}, "where": {"type": "object", "properties": {"lat": {"type": "number"}}}
        }}),
    );
    let r = request(&op, json!({"path-id": "x", "body-id": "y", "page-size": 5, "where": {"lat": 1.5}}));
    assert_eq!(r.url, "https://api.example.com/v1/items/x");
    assert_eq!(r.content_type.as_deref(), Some("application/json"));
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body, json!({"id": "y", "pageSize": 5, "where": {"lat": 1.5}}));
    assert_eq!(
        build_request("https://h", &op, &json!({"path-id": "x"})),
        Err(CallError::MissingFlag { flag: "page-size".into() })
    );
}

/// A null goes in a JSON body where the caller gave it: a required field that may be null
/// (Pydantic's `Optional[int]` with no default), or an optional one whose default is not null.
/// An optional field whose default is null is filled in with it when not given, and sending
/// that would ask a service that tells null from absent to clear the field: it is left out.
/// A form has no null: left out.
#[test]
fn a_null_is_sent_in_a_json_body_where_the_caller_gave_it() {
    let nullable = |default: Option<Value>| {
        let mut s = json!({"anyOf": [{"type": "integer"}, {"type": "null"}]});
        if let Some(d) = default {
            s["default"] = d;
        }
        s
    };
    let op = body_op(
        "application/json",
        json!({"type": "object", "required": ["limit"], "properties": {
            "limit": nullable(None), "page": nullable(Some(json!(null))), "size": nullable(Some(json!(10))), "top": nullable(None)
        }}),
    );
    let r = request(&op, json!({"id": "x", "limit": null, "page": null, "size": null, "top": null}));
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body, json!({"limit": null, "size": null, "top": null}));
    assert_eq!(
        build_request("https://h", &op, &json!({"id": "x"})),
        Err(CallError::MissingFlag { flag: "limit".into() }),
        "a required field given nothing is still missing"
    );
    let form = body_op(
        "application/x-www-form-urlencoded",
        json!({"type": "object", "properties": {"a": nullable(None), "b": {"type": "string"}}}),
    );
    let r = request(&form, json!({"id": "1", "a": null, "b": "x"}));
    assert_eq!(String::from_utf8(r.body).unwrap(), "b=x");
    // A required value given as null where null cannot go is said so, not as left out.
    let reason = "the path cannot carry null, and the service requires a value: give one".to_string();
    assert_eq!(
        build_request("https://h", &op, &json!({"id": null, "limit": 1})),
        Err(CallError::BadValue { flag: "id".into(), reason })
    );
    let form = body_op(
        "application/x-www-form-urlencoded",
        json!({"type": "object", "required": ["a"], "properties": {"a": nullable(None)}}),
    );
    let reason = "a form body cannot carry null, and the service requires a value: give one".to_string();
    assert_eq!(
        build_request("https://h", &form, &json!({"id": "1", "a": null})),
        Err(CallError::BadValue { flag: "a".into(), reason })
    );
}

/// Fields in name order: the body does not hang on map order.
#[test]
fn a_form_body_repeats_array_fields() {
    let op = body_op(
        "application/x-www-form-urlencoded",
        json!({"type": "object", "properties": {"To": {"type": "string"}, "Body": {"type": "string"}, "MediaUrl": {"type": "array", "items": {"type": "string"}}}}),
    );
    let r = request(&op, json!({"id": "1", "to": "+1 555", "body": "hi & bye", "media-url": ["a", "b"]}));
    assert_eq!(r.content_type.as_deref(), Some("application/x-www-form-urlencoded"));
    assert_eq!(String::from_utf8(r.body).unwrap(), "Body=hi+%26+bye&MediaUrl=a&MediaUrl=b&To=%2B1+555");
}

#[test]
fn a_multipart_body_sends_binary_fields_as_files() {
    let op = body_op(
        "multipart/form-data",
        json!({"type": "object", "properties": {"file": {"type": "string", "format": "binary"}, "purpose": {"type": "string"}}}),
    );
    let r = request(&op, json!({"id": "1", "file": "bytes here", "purpose": "fine-tune"}));
    let ct = r.content_type.unwrap();
    let boundary = ct.strip_prefix("multipart/form-data; boundary=").expect("a boundary");
    let want = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"file\"\r\nContent-Type: application/octet-stream\r\n\r\nbytes here\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nfine-tune\r\n--{boundary}--\r\n"
    );
    assert_eq!(String::from_utf8(r.body).unwrap(), want);
    // The same input gives the same request.
    let again = request(&op, json!({"id": "1", "file": "bytes here", "purpose": "fine-tune"}));
    assert_eq!(again.content_type.unwrap(), ct);
}

/// Regression: a file whose name a part cannot carry was refused as `--body`, a flag the tool
/// may not even have, rather than as the field's own. A quote is written as browsers write it.
#[test]
fn a_multipart_file_that_cannot_be_sent_is_refused_by_its_own_flag() {
    let op = body_op(
        "multipart/form-data",
        json!({"type": "object", "properties": {"upload": {"type": "string", "format": "binary"}, "purpose": {"type": "string"}}}),
    );
    let input = json!({"id": "1", "upload": "data:text/plain;name=a%00b.txt;base64,aGk=", "purpose": "x"});
    match build_request("https://h", &op, &input) {
        Err(CallError::BadValue { flag, reason }) => {
            assert_eq!(flag, "upload");
            assert_eq!(reason, r#"a file name cannot hold a NUL byte: "a\0b.txt""#);
        }
        other => panic!("{other:?}"),
    }
    let input = json!({"id": "1", "upload": "data:text/plain;name=a%22b.txt;base64,aGk=", "purpose": "x"});
    let r = request(&op, input);
    assert!(
        String::from_utf8_lossy(&r.body).contains(r#"filename="a%22b.txt""#),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
}

#[test]
fn a_file_field_of_a_json_body_goes_as_base64() {
    let op = body_op(
        "application/json",
        json!({"type": "object", "properties": {"file": {"type": "string", "format": "binary"},
            "files": {"type": "array", "items": {"type": "string", "format": "binary"}}, "note": {"type": "string"}}}),
    );
    // A file read from disk arrives as a data URL; text typed as the value goes as it is.
    let url = "data:application/octet-stream;name=bin.dat;base64,aGVsbG8A//4=";
    let r = request(&op, json!({"id": "1", "file": url, "files": [url, "typed"], "note": url}));
    let sent: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(sent, json!({"file": "aGVsbG8A//4=", "files": ["aGVsbG8A//4=", "typed"], "note": url}));
}

#[test]
fn a_text_body_is_sent_as_given() {
    let op = body_op("text/plain", json!({"type": "string"}));
    let r = request(&op, json!({"id": "1", "body": "line 1\nline 2"}));
    assert_eq!((r.content_type.as_deref(), r.body.as_slice()), (Some("text/plain"), b"line 1\nline 2".as_slice()));
    assert_eq!(
        build_request("https://h", &op, &json!({"id": "1"})),
        Err(CallError::MissingFlag { flag: "body".into() })
    );
}

#[test]
fn an_optional_body_left_out_sends_nothing() {
    let op = operation(
        "/x",
        "post",
        json!({"requestBody": {"content": {"application/json": {"schema": {"type": "object", "properties": {"a": {"type": "string"}}}}}}}),
    );
    let r = request(&op, json!({}));
    assert_eq!((r.method.as_str(), r.body.len(), r.content_type), ("POST", 0, None));
}

#[test]
fn the_documents_own_path_text_is_escaped_where_a_url_needs_it() {
    let op = operation(
        "/files/my file/{id}:copy/%41",
        "post",
        json!({"parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}]}),
    );
    assert_eq!(request(&op, json!({"id": "x y"})).url, "https://api.example.com/v1/files/my%20file/x%20y:copy/%41");
}

#[test]
fn a_required_body_with_nothing_given_is_sent_empty() {
    let op = operation(
        "/x",
        "post",
        json!({"requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "properties": {"a": {"type": "string"}}}}}}}),
    );
    let r = request(&op, json!({}));
    assert_eq!((r.body.as_slice(), r.content_type.as_deref()), (b"{}".as_slice(), Some("application/json")));
}

#[test]
fn a_query_written_in_the_path_comes_first() {
    let op = operation(
        "/search?type=user",
        "get",
        json!({"parameters": [{"name": "q", "in": "query", "schema": {"type": "string"}}]}),
    );
    assert_eq!(request(&op, json!({"q": "a b"})).url, "https://api.example.com/v1/search?type=user&q=a%20b");
    assert_eq!(request(&op, json!({})).url, "https://api.example.com/v1/search?type=user");
}

/// A body that takes keys beyond its named ones (`additionalProperties` true or a schema) has
/// one more field, `extra-fields`, an object merged into the body; a key that is a named field
/// is refused, naming that field's own flag. Without `additionalProperties`, or with it false,
/// there is no such field.
#[test]
fn a_body_with_additional_properties_takes_them_as_one_object() {
    let schema = |extra: Value| {
        let mut s = json!({"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}});
        if !extra.is_null() {
            s["additionalProperties"] = extra;
        }
        s
    };
    let op = body_op("application/json", schema(json!({"type": "string"})));
    assert_eq!(
        op.input_schema["properties"]["extra-fields"]["additionalProperties"],
        json!({"type": "string"}),
        "{}",
        op.input_schema
    );
    let r = request(&op, json!({"id": "1", "name": "n", "extra-fields": {"color": "red", "size": "L"}}));
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body, json!({"name": "n", "color": "red", "size": "L"}));
    // Without extras, the body is as before.
    let r = request(&op, json!({"id": "1", "name": "n"}));
    assert_eq!(serde_json::from_slice::<Value>(&r.body).unwrap(), json!({"name": "n"}));
    let e =
        build_request("https://h", &op, &json!({"id": "1", "name": "n", "extra-fields": {"name": "m"}})).unwrap_err();
    assert_eq!(
        e,
        CallError::BadValue {
            flag: "extra-fields".into(),
            reason: "\"name\" is a named field of the body (and it is given): set it with --name".into()
        }
    );
    // A form body takes them too; an object goes as its JSON text under its key, never as
    // fields of its own (which could be named as a named field).
    let op = body_op("application/x-www-form-urlencoded", schema(json!(true)));
    let r = request(
        &op,
        json!({"id": "1", "name": "n", "extra-fields": {"metadata[plan]": "pro", "meta": {"name": "x"}, "tags": ["a", "b"]}}),
    );
    assert_eq!(
        String::from_utf8(r.body).unwrap(),
        "name=n&meta=%7B%22name%22%3A%22x%22%7D&metadata%5Bplan%5D=pro&tags=a&tags=b"
    );
    for closed in [Value::Null, json!(false)] {
        let op = body_op("application/json", schema(closed.clone()));
        assert!(op.input_schema["properties"].get("extra-fields").is_none(), "{closed}: {}", op.input_schema);
    }
    // The document's names are settled first and never moved: the extra keys take a name that
    // is left.
    let names = |op: &Operation| -> Vec<String> {
        let mut n: Vec<String> = op.input_schema["properties"].as_object().unwrap().keys().cloned().collect();
        n.sort();
        n
    };
    let op = body_op(
        "application/json",
        json!({"type": "object", "properties": {"extraFields": {"type": "string"}}, "additionalProperties": true}),
    );
    assert_eq!(names(&op), ["body-extra-fields", "extra-fields", "id"]);
    assert_eq!(op.bindings.last().unwrap().property, "body-extra-fields");
    let op = operation(
        "/items",
        "post",
        json!({
            "parameters": [{"name": "extra_fields", "in": "query", "schema": {"type": "string"}}],
            "requestBody": {"content": {"application/json": {"schema":
                {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": true}}}}
        }),
    );
    assert_eq!(names(&op), ["a", "body-extra-fields", "extra-fields"]);
    assert_eq!(op.bindings[0].property, "extra-fields", "the query parameter keeps its name");
}
