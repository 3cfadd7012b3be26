//! The rules of `import`, one small document each: tool names, `$ref`s and cycles, `allOf`,
//! nulls, parameters, bodies, name collisions, refusals and `include`.

use agentos_core::flagmap::{flag_table, validate};
use agentos_openapi::{
    BodyEncoding, ImportError, ImportOptions, Imported, Limits, Location, Operation, SecurityKind, import, import_value,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

fn doc(paths: Value) -> Value {
    json!({"openapi": "3.0.3", "info": {"title": "t", "version": "1"}, "paths": paths})
}

fn doc_with(paths: Value, components: Value) -> Value {
    json!({"openapi": "3.1.0", "info": {"title": "t", "version": "1"}, "paths": paths, "components": components})
}

fn ok(d: &Value) -> Imported {
    import_value(d, &ImportOptions::default()).unwrap_or_else(|e| panic!("refused: {e}"))
}

fn refused(d: &Value) -> ImportError {
    match import_value(d, &ImportOptions::default()) {
        Ok(i) => panic!("imported {} tools", i.operations.len()),
        Err(e) => e,
    }
}

fn op<'a>(i: &'a Imported, name: &str) -> &'a Operation {
    let names: Vec<&str> = i.operations.iter().map(|o| o.name.as_str()).collect();
    i.operations.iter().find(|o| o.name == name).unwrap_or_else(|| panic!("no tool {name}; have {names:?}"))
}

fn hash6(method_path: &str) -> String {
    hex::encode(&Sha256::digest(method_path.as_bytes())[..3])
}

/// One operation, GET `path`, with `operationId` when given.
fn named(path: &str, operation_id: Option<&str>) -> String {
    let mut op = json!({"responses": {"200": {"description": "ok"}}});
    if let Some(id) = operation_id {
        op["operationId"] = json!(id);
    }
    let i = ok(&doc(json!({ path: {"get": op} })));
    assert_eq!(i.operations.len(), 1);
    i.operations[0].name.clone()
}

#[test]
fn tool_names_come_from_the_operation_id_or_the_method_and_path() {
    let long = "a".repeat(70);
    let cases: &[(&str, Option<&str>, String)] = &[
        ("/x", Some("echo_Word.v2"), "echo-word-v2".into()),
        ("/x", Some("listPets"), "list-pets".into()),
        ("/x", Some("find pet by id"), "find-pet-by-id".into()),
        ("/x", Some("list-searchable-fields"), "list-searchable-fields".into()),
        ("/x", Some("getURLParser"), "get-url-parser".into()),
        ("/users/{id}", None, "get-users-by-id".into()),
        ("/users/{userId}/posts/{postId}", None, "get-users-by-user-id-posts-by-post-id".into()),
        ("/Accounts/{AccountSid}.json", None, "get-accounts-by-account-sid-json".into()),
        ("/", None, "get".into()),
        // Nothing usable in the operationId: the method and path instead.
        ("/users", Some("__"), "get-users".into()),
        ("/x", Some(long.as_str()), format!("{}-{}", "a".repeat(57), hash6("GET /x"))),
    ];
    for (path, id, want) in cases {
        assert_eq!(&named(path, *id), want, "{path} {id:?}");
    }
}

#[test]
fn colliding_names_all_get_the_hash_and_do_not_depend_on_document_order() {
    let get = |id: &str| json!({"operationId": id, "responses": {}});
    let a = doc(json!({"/a": {"get": get("dup")}, "/b": {"get": get("dup")}, "/c": {"get": get("other")}}));
    let b = doc(json!({"/c": {"get": get("other")}, "/b": {"get": get("dup")}, "/a": {"get": get("dup")}}));
    let names = |d: &Value| ok(d).operations.iter().map(|o| o.name.clone()).collect::<Vec<_>>();
    let want = vec![format!("dup-{}", hash6("GET /a")), format!("dup-{}", hash6("GET /b")), "other".to_string()];
    assert_eq!(names(&a), want);
    assert_eq!(names(&b), want);
}

#[test]
fn operations_are_ordered_by_path_then_method() {
    let r = json!({"responses": {}});
    let i = ok(&doc(json!({"/b": {"post": r, "get": r}, "/a": {"delete": r}})));
    let order: Vec<(&str, &str)> = i.operations.iter().map(|o| (o.path.as_str(), o.method.as_str())).collect();
    assert_eq!(order, [("/a", "DELETE"), ("/b", "GET"), ("/b", "POST")]);
}

fn body_op(schema: Value, components: Value) -> Imported {
    ok(&doc_with(
        json!({"/n": {"post": {"operationId": "n", "requestBody": {"required": true, "content": {"application/json": {"schema": schema}}}, "responses": {}}}}),
        components,
    ))
}

#[test]
fn a_recursive_schema_stays_recursive_through_defs() {
    let i = body_op(
        json!({"$ref": "#/components/schemas/Node"}),
        json!({"schemas": {"Node": {"type": "object", "required": ["value"], "properties": {
            "value": {"type": "string"},
            "children": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}}
        }}}}),
    );
    let s = &op(&i, "n").input_schema;
    assert_eq!(s["properties"]["children"]["items"], json!({"$ref": "#/$defs/Node"}));
    assert_eq!(s["$defs"]["Node"]["properties"]["children"]["items"], json!({"$ref": "#/$defs/Node"}));
    assert_eq!(s["required"], json!(["value"]));
    // The validator the engine runs follows the references.
    let table = flag_table(s);
    let good = json!({"value": "a", "children": [{"value": "b", "children": [{"value": "c"}]}]});
    assert_eq!(validate(s, &table, &good), Ok(()));
    let bad = json!({"value": "a", "children": [{"children": []}]});
    assert!(validate(s, &table, &bad).is_err(), "a nested node without its value is refused");
}

#[test]
fn mutually_recursive_schemas_and_escaped_pointers() {
    let i = body_op(
        json!({"$ref": "#/components/schemas/a~1b"}),
        json!({"schemas": {
            "a/b": {"type": "object", "properties": {"planet": {"$ref": "#/components/schemas/Planet"}}},
            "Planet": {"type": "object", "properties": {"moons": {"type": "array", "items": {"$ref": "#/components/schemas/Moon"}}}},
            "Moon": {"type": "object", "properties": {"planet": {"$ref": "#/components/schemas/Planet"}}}
        }}),
    );
    let s = &op(&i, "n").input_schema;
    // Planet is inlined once, and its recursion kept as a reference.
    assert_eq!(
        s["properties"]["planet"]["properties"]["moons"]["items"]["properties"]["planet"],
        json!({"$ref": "#/$defs/Planet"})
    );
    assert!(s["$defs"]["Planet"]["properties"]["moons"]["items"]["$ref"] == json!("#/$defs/Moon"));
    assert!(s["$defs"]["Moon"].is_object());
}

#[test]
fn all_of_is_merged_and_one_of_kept() {
    let i = body_op(
        json!({"allOf": [{"$ref": "#/components/schemas/NewPet"}, {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}]}),
        json!({"schemas": {
            "NewPet": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string", "description": "the name"},
                "kind": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                "secret": {"type": "string", "readOnly": true}
            }}
        }}),
    );
    let s = &op(&i, "n").input_schema;
    let mut props: Vec<&String> = s["properties"].as_object().unwrap().keys().collect();
    props.sort();
    assert_eq!(props, ["id", "kind", "name"], "readOnly properties are not input");
    assert_eq!(s["required"], json!(["id", "name"]));
    assert_eq!(s["properties"]["name"]["description"], "the name");
    assert_eq!(s["properties"]["kind"]["oneOf"], json!([{"type": "string"}, {"type": "integer"}]));
}

#[test]
fn nulls_of_both_versions_become_type_arrays() {
    let i = body_op(
        json!({"type": "object", "properties": {
            "a": {"type": ["string", "null"]},
            "b": {"type": "string", "nullable": true},
            "c": {"type": "string", "enum": ["x", "y"], "nullable": true},
            "d": {"type": "integer", "minimum": 0, "exclusiveMinimum": true}
        }}),
        json!({}),
    );
    let p = &op(&i, "n").input_schema["properties"];
    assert_eq!(p["a"]["type"], json!(["string", "null"]));
    assert_eq!(p["b"]["type"], json!(["string", "null"]));
    assert_eq!(p["c"]["enum"], json!(["x", "y", null]));
    assert_eq!(p["d"], json!({"type": "integer", "exclusiveMinimum": 0}));
}

/// A required value whose place cannot carry null (path, query, header, cookie, a form's field)
/// is not offered null: a call would refuse it. An optional one keeps it (null leaves it out),
/// and so does a required field of a JSON body (null is sent).
#[test]
fn null_is_offered_only_where_a_call_can_send_it() {
    let query = |name: &str, required: bool, schema: Value| json!({"name": name, "in": "query", "required": required, "schema": schema});
    let i = ok(&doc(json!({"/q/{id}": {"post": {"operationId": "q", "parameters": [
        {"name": "id", "in": "path", "required": true, "schema": {"type": "string", "nullable": true}},
        query("since", true, json!({"type": ["integer", "null"], "minimum": 0})),
        query("mode", true, json!({"enum": ["a", "b", null]})),
        query("tag", true, json!({"anyOf": [{"type": "string", "maxLength": 9}, {"type": "null"}], "title": "Tag"})),
        query("pick", true, json!({"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]})),
        query("only", true, json!({"type": "null"})),
        query("dflt", true, json!({"type": "string", "nullable": true, "default": null})),
        query("inner", true, json!({"anyOf": [{"type": ["string", "null"]}, {"type": "null"}]})),
        query("later", false, json!({"type": ["string", "null"]})),
        {"name": "X-Key", "in": "header", "required": true, "schema": {"type": ["string", "null"]}}
    ], "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object",
        "required": ["note"], "properties": {"note": {"type": ["string", "null"]}}}}}}, "responses": {}}}})));
    let p = &op(&i, "q").input_schema["properties"];
    assert_eq!(p["id"]["type"], "string");
    assert_eq!(p["since"], json!({"type": "integer", "minimum": 0}));
    assert_eq!(p["mode"]["enum"], json!(["a", "b"]));
    assert_eq!(p["tag"], json!({"type": "string", "maxLength": 9, "title": "Tag"}));
    assert_eq!(p["pick"]["oneOf"], json!([{"type": "string"}, {"type": "integer"}]));
    assert_eq!(p["only"], json!({"type": "null"}), "a schema that is only null is left as written");
    assert_eq!(p["dflt"], json!({"type": "string"}), "a null default would fill in the null taken out");
    assert_eq!(p["inner"], json!({"type": "string"}), "a branch's own null too");
    assert_eq!(p["later"]["type"], json!(["string", "null"]), "an optional query's null leaves it out");
    assert_eq!(p["x-key"]["type"], "string");
    assert_eq!(p["note"]["type"], json!(["string", "null"]), "a JSON body sends null");
    let flags = flag_table(&op(&i, "q").input_schema);
    let no_form: Vec<&str> = flags.flags.iter().filter(|f| f.takes_no_form()).map(|f| f.flag.as_str()).collect();
    assert_eq!(no_form, ["later", "note"]);

    let form = ok(&doc(json!({"/f": {"post": {"operationId": "f", "requestBody": {"required": true, "content": {
        "application/x-www-form-urlencoded": {"schema": {"type": "object", "required": ["a"], "properties": {
            "a": {"type": ["string", "null"]}, "b": {"type": ["string", "null"]}}}}}}, "responses": {}}}})));
    let p = &op(&form, "f").input_schema["properties"];
    assert_eq!(p["a"]["type"], "string", "a required form field");
    assert_eq!(p["b"]["type"], json!(["string", "null"]));
}

#[test]
fn path_level_parameters_merge_and_the_operation_wins() {
    let i = ok(&doc_with(
        json!({"/users/{id}": {
            "parameters": [
                {"$ref": "#/components/parameters/Id"},
                {"name": "verbose", "in": "query", "description": "path level", "schema": {"type": "boolean"}}
            ],
            "get": {"operationId": "get-user", "parameters": [
                {"name": "verbose", "in": "query", "description": "operation level", "schema": {"type": "boolean", "default": false}},
                {"name": "Accept", "in": "header", "schema": {"type": "string"}},
                {"name": "Content-Length", "in": "header", "schema": {"type": "integer"}},
                {"name": "Transfer-Encoding", "in": "header", "schema": {"type": "string"}},
                {"name": "Host", "in": "header", "schema": {"type": "string"}},
                {"name": "X-Forwarded-For", "in": "header", "schema": {"type": "string"}},
                {"name": "X-Trace", "in": "header", "required": true, "schema": {"type": "string"}}
            ], "responses": {}}
        }}),
        json!({"parameters": {"Id": {"name": "id", "in": "path", "required": true, "description": "the id", "schema": {"type": "string"}}}}),
    ));
    let o = op(&i, "get-user");
    let p = &o.input_schema["properties"];
    assert_eq!(p["id"]["description"], "the id");
    assert_eq!(p["verbose"], json!({"type": "boolean", "default": false, "description": "operation level"}));
    for name in ["accept", "content-length", "transfer-encoding", "host", "x-forwarded-for"] {
        assert!(p.get(name).is_none(), "{name} is the request's to set");
    }
    assert_eq!(o.input_schema["required"], json!(["id", "x-trace"]));
    let where_: Vec<(&str, Location, &str)> =
        o.bindings.iter().map(|b| (b.property.as_str(), b.location, b.name.as_str())).collect();
    assert_eq!(
        where_,
        [
            ("id", Location::Path, "id"),
            ("verbose", Location::Query, "verbose"),
            ("x-trace", Location::Header, "X-Trace")
        ]
    );
}

#[test]
fn a_name_in_two_locations_is_prefixed_with_each_location() {
    let i = ok(&doc(json!({"/keys/{key}": {"put": {
        "operationId": "update-key",
        "parameters": [
            {"name": "key", "in": "path", "required": true, "schema": {"type": "string"}},
            {"name": "json", "in": "query", "schema": {"type": "boolean"}}
        ],
        "requestBody": {"content": {"application/json": {"schema": {"type": "object", "properties": {
            "key": {"type": "string"}, "pageSize": {"type": "integer"}, "where": {"type": "object", "properties": {"lat": {"type": "number"}}}
        }}}}},
        "responses": {}
    }}})));
    let o = op(&i, "update-key");
    let where_: Vec<(&str, Location, &str)> =
        o.bindings.iter().map(|b| (b.property.as_str(), b.location, b.name.as_str())).collect();
    assert_eq!(
        where_,
        [
            ("path-key", Location::Path, "key"),
            // `--json` is the command line's own flag.
            ("query-json", Location::Query, "json"),
            ("body-key", Location::BodyField, "key"),
            ("page-size", Location::BodyField, "pageSize"),
            ("where", Location::BodyField, "where"),
        ]
    );
    let mut flags: Vec<String> = flag_table(&o.input_schema).flags.iter().map(|f| f.flag.clone()).collect();
    flags.sort();
    assert_eq!(flags, ["body-key", "page-size", "path-key", "query-json", "where.lat"]);
}

fn body_of(content: Value) -> Operation {
    let i =
        ok(&doc(json!({"/b": {"post": {"operationId": "b", "requestBody": {"content": content}, "responses": {}}}})));
    i.operations[0].clone()
}

#[test]
fn bodies_prefer_json_then_form_then_multipart_then_raw() {
    let obj = json!({"schema": {"type": "object", "properties": {"a": {"type": "string"}}}});
    let cases = [
        (
            json!({"application/xml": obj, "application/x-www-form-urlencoded": obj, "application/json": obj}),
            "application/json",
            BodyEncoding::Json,
        ),
        (
            json!({"application/json;simple": obj, "application/json-patch+json": obj}),
            "application/json;simple",
            BodyEncoding::Json,
        ),
        (
            json!({"application/vnd.api+json": obj, "multipart/form-data": obj}),
            "application/vnd.api+json",
            BodyEncoding::Json,
        ),
        (
            json!({"multipart/form-data": obj, "application/x-www-form-urlencoded": obj}),
            "application/x-www-form-urlencoded",
            BodyEncoding::Form,
        ),
        (json!({"text/plain": obj, "multipart/form-data": obj}), "multipart/form-data", BodyEncoding::Multipart),
        (json!({"text/plain": {"schema": {"type": "string"}}}), "text/plain", BodyEncoding::Raw),
    ];
    for (content, media_type, encoding) in cases {
        let o = body_of(content.clone());
        let body = o.body.as_ref().expect("a body");
        assert_eq!((body.media_type.as_str(), body.encoding), (media_type, encoding), "{content}");
        if encoding == BodyEncoding::Raw {
            assert_eq!(o.bindings[0].location, Location::Body);
            assert_eq!(o.bindings[0].property, "body");
        } else {
            assert_eq!(o.bindings[0].location, Location::BodyField, "{content}");
            assert_eq!(o.bindings[0].property, "a");
        }
    }
}

#[test]
fn a_body_that_is_not_an_object_is_one_property() {
    let o = body_of(json!({"application/json": {"schema": {"type": "array", "items": {"type": "string"}}}}));
    assert_eq!(o.input_schema["properties"]["body"], json!({"type": "array", "items": {"type": "string"}}));
    let o = body_of(json!({"application/octet-stream": {}}));
    assert_eq!(o.input_schema["properties"]["body"], json!({"type": "string", "format": "binary"}));
}

#[test]
fn one_of_object_bodies_are_flattened_into_their_union() {
    let o = body_of(json!({"application/json": {"schema": {"oneOf": [
        {"type": "object", "required": ["method", "password"], "properties": {"method": {"const": "password"}, "password": {"type": "string"}}},
        {"type": "object", "required": ["method"], "properties": {"method": {"const": "oidc"}, "provider": {"type": "string"}}}
    ]}}}));
    let p = &o.input_schema["properties"];
    assert_eq!(p["method"]["enum"], json!(["password", "oidc"]));
    assert!(p["password"].is_object() && p["provider"].is_object());
    // Optional body: nothing in it is required of the caller.
    assert!(o.input_schema.get("required").is_none());
}

#[test]
fn a_bad_operation_is_skipped_and_listed_with_its_pointer() {
    let i = ok(&doc(json!({
        "/good": {"get": {"operationId": "good", "responses": {}}},
        "/bad": {"get": {"operationId": "bad", "parameters": [{"name": "x", "in": "query", "schema": {"$ref": "#/components/schemas/Missing"}}], "responses": {}}}
    })));
    assert_eq!(i.operations.len(), 1);
    assert_eq!(i.skipped.len(), 1);
    assert_eq!(i.skipped[0].pointer, "/paths/~1bad/get");
    assert!(i.skipped[0].reason.contains("#/components/schemas/Missing"), "{}", i.skipped[0].reason);
}

#[test]
fn a_multipart_field_whose_name_a_part_cannot_carry_is_skipped() {
    let body = |name: &str| {
        json!({"post": {"operationId": "up", "requestBody": {"content": {"multipart/form-data": {"schema": {
            "type": "object", "properties": {name: {"type": "string"}, "file": {"type": "string", "format": "binary"}}}}}},
            "responses": {}}})
    };
    let i = ok(&doc(json!({"/ok": body("purpose"), "/bad": body("we\"ird")})));
    assert_eq!(i.operations.len(), 1);
    assert_eq!(i.skipped[0].pointer, "/paths/~1bad/post");
    assert!(i.skipped[0].reason.contains("holds a quote or line break"), "{}", i.skipped[0].reason);
}

/// Regression: a header parameter named `"Bad Name\r\nX"` was imported, and every call of the
/// tool then failed with "invalid HTTP header name".
#[test]
fn a_header_or_cookie_parameter_whose_name_is_not_a_token_is_skipped() {
    let with = |name: &str, at: &str| {
        json!({"get": {"operationId": format!("op-{at}"), "parameters": [{"name": name, "in": at, "schema": {"type": "string"}}],
            "responses": {}}})
    };
    let i = ok(&doc(json!({
        "/ok": with("X-Request-Id", "header"),
        "/fine-cookie": with("session_id", "cookie"),
        "/bad": with("Bad Name\r\nX", "header"),
        "/bad-colon": with("X-A:b", "header"),
        "/bad-cookie": with("a=b; c", "cookie"),
    })));
    assert_eq!(i.operations.len(), 2, "{:?}", i.skipped);
    let mut skipped: Vec<(&str, &str)> = i.skipped.iter().map(|s| (s.pointer.as_str(), s.reason.as_str())).collect();
    skipped.sort();
    let pointers: Vec<&str> = skipped.iter().map(|s| s.0).collect();
    assert_eq!(pointers, ["/paths/~1bad-colon/get", "/paths/~1bad-cookie/get", "/paths/~1bad/get"]);
    assert!(skipped[1].1.contains(r#"the cookie parameter "a=b; c" is not a valid cookie name"#), "{skipped:?}");
    assert!(
        skipped[2].1.contains(r#"the header parameter "Bad Name\r\nX" is not a valid HTTP header name"#),
        "{skipped:?}"
    );
}

#[test]
fn refusals_say_what_was_found() {
    let cases: Vec<(Value, ImportError)> = vec![
        (json!({"swagger": "2.0", "paths": {}}), ImportError::Swagger2 { version: "2.0".into() }),
        (json!({"info": {}, "paths": {}}), ImportError::NotOpenApi { found: "keys info, paths".into() }),
        (json!({"openapi": "4.0.0"}), ImportError::UnsupportedVersion { version: "4.0.0".into() }),
        (json!([1]), ImportError::NotAnObject { found: "an array" }),
        (
            json!({"openapi": "3.1.0", "webhooks": {"w": {}}}),
            ImportError::NoOperations {
                pointer: "/paths".into(),
                reason: "the document has no `paths`, only 1 webhook(s), which the service calls rather than being called".into(),
            },
        ),
        (
            doc(json!({"/x": {"summary": "no operations"}})),
            ImportError::NoOperations { pointer: "/paths".into(), reason: "`paths` has no operations".into() },
        ),
        (
            doc(json!({"/a": {"get": {"parameters": [{"name": "q", "in": "body"}]}}})),
            ImportError::NoOperations {
                pointer: "/paths/~1a/get".into(),
                reason: "every operation was skipped; the first because parameter \"q\" has `in: body`, not path, query, header or cookie".into(),
            },
        ),
        (
            doc(json!({"/a/{id}": {"get": {"parameters": [{"name": "id", "in": "path", "schema": {"$ref": "common.yaml#/Id"}}]}}})),
            ImportError::ExternalRef { pointer: "/paths/~1a~1{id}/get/parameters/0/schema/$ref".into(), reference: "common.yaml#/Id".into() },
        ),
        (
            doc(json!({"/a": {"$ref": "https://example.com/paths.yaml"}})),
            ImportError::ExternalRef { pointer: "/paths/~1a/$ref".into(), reference: "https://example.com/paths.yaml".into() },
        ),
    ];
    for (d, want) in cases {
        assert_eq!(refused(&d), want, "{d}");
    }
    let swagger = refused(&json!({"swagger": "2.0"})).to_string();
    assert!(swagger.contains("convert it to OpenAPI 3 first"), "{swagger}");
}

#[test]
fn limits_are_named_when_a_document_passes_them() {
    let small = |f: fn(&mut Limits)| {
        let mut limits = Limits::default();
        f(&mut limits);
        ImportOptions { include: None, limits }
    };
    let text = serde_json::to_vec(&doc(json!({"/a": {"get": {}}, "/b": {"get": {}, "post": {}}}))).unwrap();
    let e = import(&text, &small(|l| l.max_bytes = 10)).unwrap_err();
    assert_eq!(e, ImportError::TooLarge { size: text.len(), limit: 10 });
    assert!(e.to_string().contains("max_bytes"));
    let e = import(&text, &small(|l| l.max_operations = 2)).unwrap_err();
    assert_eq!(e, ImportError::TooManyOperations { count: 3, limit: 2 });
    assert!(e.to_string().contains("max_operations"));
    let e = import(&text, &small(|l| l.max_depth = 3)).unwrap_err();
    assert_eq!(e, ImportError::TooDeep { limit: 3 });
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    assert_eq!(import(deep.as_bytes(), &ImportOptions::default()).unwrap_err(), ImportError::TooDeep { limit: 100 });
    let deep_yaml = format!("a: {}1{}", "[".repeat(120), "]".repeat(120));
    assert_eq!(
        import(deep_yaml.as_bytes(), &ImportOptions::default()).unwrap_err(),
        ImportError::TooDeep { limit: 100 }
    );
    let e = import_value(&doc(json!({"/a": {"get": {}}})), &small(|l| l.max_depth = 2)).unwrap_err();
    assert_eq!(e, ImportError::TooDeep { limit: 2 });
}

/// `levels` anchors, each a list of ten aliases of the one before.
fn alias_bomb(levels: usize) -> String {
    let mut yaml = String::from("openapi: 3.0.0\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..levels {
        let p = i - 1;
        yaml.push_str(&format!("a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"));
    }
    yaml
}

#[test]
fn a_yaml_alias_bomb_is_refused_before_it_expands() {
    let start = std::time::Instant::now();
    // 10^12 values asked for: the YAML reader's own bound on alias expansions trips first.
    let e = import(alias_bomb(12).as_bytes(), &ImportOptions::default()).unwrap_err();
    assert!(matches!(e, ImportError::YamlAliases { .. }), "{e}");
    assert!(e.to_string().contains("aliases"), "{e}");
    assert!(start.elapsed().as_secs() < 20, "took {:?}", start.elapsed());
    // Within the reader's bound, counting values stops it at max_nodes.
    let limits = Limits { max_nodes: 1_000, ..Limits::default() };
    let e = import(alias_bomb(4).as_bytes(), &ImportOptions { include: None, limits }).unwrap_err();
    assert_eq!(e, ImportError::TooManyNodes { limit: 1_000 });
    assert!(e.to_string().contains("max_nodes") && e.to_string().contains("aliases"), "{e}");
}

#[test]
fn yaml_reads_like_json() {
    let yaml = "openapi: 3.0.0\ninfo: {title: T, version: 2}\npaths:\n  /pets:\n    get:\n      operationId: listPets\n      responses:\n        200: {description: ok}\n";
    let i = import(yaml.as_bytes(), &ImportOptions::default()).expect("imports");
    assert_eq!((i.title.as_str(), i.version.as_str(), i.openapi.as_str()), ("T", "2", "3.0.0"));
    assert_eq!(i.operations[0].name, "list-pets");
    let e = import(b"openapi: [", &ImportOptions::default()).unwrap_err();
    assert!(matches!(e, ImportError::Syntax { format: "YAML", .. }), "{e}");
    let e = import(b"{\"openapi\": ", &ImportOptions::default()).unwrap_err();
    assert!(matches!(e, ImportError::Syntax { format: "JSON", .. }), "{e}");
}

#[test]
fn include_keeps_the_named_tools_and_refuses_unknown_names() {
    let r = json!({"responses": {}});
    let d = doc(json!({"/a": {"get": r, "post": r}, "/b": {"get": r}}));
    let with = |names: &[&str]| ImportOptions {
        include: Some(names.iter().map(|n| n.to_string()).collect()),
        limits: Limits::default(),
    };
    let i = import_value(&d, &with(&["post-a", "get-b"])).expect("imports");
    let names: Vec<&str> = i.operations.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["post-a", "get-b"]);
    assert_eq!(
        import_value(&d, &with(&["get-a", "nope", "delete-b"])).unwrap_err(),
        ImportError::UnknownInclude { names: vec!["nope".into(), "delete-b".into()] }
    );
}

#[test]
fn security_schemes_are_listed_for_the_auth_check() {
    let d = json!({"openapi": "3.0.0", "paths": {"/a": {"get": {}}}, "components": {"securitySchemes": {
        "bearer": {"type": "http", "scheme": "Bearer"},
        "basic": {"type": "http", "scheme": "basic"},
        "key": {"type": "apiKey", "in": "query", "name": "api_key"}
    }}});
    let kinds: Vec<(String, SecurityKind)> = ok(&d).security.into_iter().map(|s| (s.name, s.kind)).collect();
    assert_eq!(
        kinds,
        [
            ("basic".into(), SecurityKind::Basic),
            ("bearer".into(), SecurityKind::Bearer),
            ("key".into(), SecurityKind::ApiKey { location: Location::Query, name: "api_key".into() }),
        ]
    );
}

#[test]
fn an_undeclared_path_variable_is_still_a_required_flag() {
    let i = ok(&doc(json!({"/files/{file_id}": {"get": {"operationId": "f", "responses": {}}}})));
    let o = op(&i, "f");
    assert_eq!(o.input_schema["required"], json!(["file-id"]));
    assert_eq!((o.bindings[0].location, o.bindings[0].name.as_str()), (Location::Path, "file_id"));
}

#[test]
fn a_path_that_would_leave_the_base_url_is_skipped() {
    let r = json!({"responses": {}});
    let i = ok(&doc(
        json!({"/ok": {"get": r}, "/a/../admin": {"get": r}, "/b/%2E%2e/x": {"get": r}, "relative": {"get": r},
            "/k/{id": {"get": r}, "/m/id}/x": {"get": r}}),
    ));
    let skipped: Vec<(&str, &str)> = i.skipped.iter().map(|s| (s.pointer.as_str(), s.reason.as_str())).collect();
    assert_eq!(
        skipped,
        // In pointer order.
        [
            ("/paths/relative/get", "the path \"relative\" does not start with /"),
            ("/paths/~1a~1..~1admin/get", "the path \"/a/../admin\" has a `.` or `..` segment"),
            ("/paths/~1b~1%2E%2e~1x/get", "the path \"/b/%2E%2e/x\" has a `.` or `..` segment"),
            ("/paths/~1k~1{id/get", "the path \"/k/{id\" has unbalanced braces"),
            ("/paths/~1m~1id}~1x/get", "the path \"/m/id}/x\" has unbalanced braces"),
        ]
    );
    assert_eq!(i.operations.len(), 1);
}

#[test]
fn keywords_beside_a_ref_refine_it() {
    let i = body_op(
        json!({"type": "object", "properties": {
            "a": {"$ref": "#/components/schemas/Name", "description": "mine", "nullable": true},
            "b": {"$ref": "#/components/schemas/Obj", "required": ["y"], "properties": {"y": {"type": "string"}}}
        }}),
        json!({"schemas": {
            "Name": {"type": "string", "description": "theirs"},
            "Obj": {"type": "object", "required": ["x"], "properties": {"x": {"type": "string"}}}
        }}),
    );
    let p = &op(&i, "n").input_schema["properties"];
    assert_eq!(p["a"], json!({"type": ["string", "null"], "description": "mine"}));
    assert_eq!(p["b"]["required"], json!(["x", "y"]));
    assert_eq!(p["b"]["properties"], json!({"x": {"type": "string"}, "y": {"type": "string"}}));
}

/// A chain of 40 schemas, each holding the next: past the inlining depth the rest stays a
/// reference, so the input schema (and every reader's recursion over it) stays shallow.
#[test]
fn a_long_chain_of_references_is_inlined_only_so_deep() {
    let mut schemas = serde_json::Map::new();
    for n in 0..40 {
        let next = if n == 39 {
            json!({"type": "string"})
        } else {
            json!({"$ref": format!("#/components/schemas/S{}", n + 1)})
        };
        schemas.insert(format!("S{n}"), json!({"type": "object", "properties": {"next": next}}));
    }
    let i = body_op(json!({"$ref": "#/components/schemas/S0"}), json!({"schemas": schemas}));
    let s = &op(&i, "n").input_schema;
    fn depth(v: &Value) -> usize {
        match v {
            Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
            Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }
    assert!(depth(&s["properties"]) <= 40, "depth {}", depth(&s["properties"]));
    let defs = s["$defs"].as_object().expect("the rest of the chain as definitions");
    assert!(defs.contains_key("S39"), "{:?}", defs.keys().collect::<Vec<_>>());
}

#[test]
fn the_first_servers_path_is_what_operations_are_called_under() {
    let with = |servers: &str| {
        let doc =
            format!(r#"{{"openapi": "3.0.3", "info": {{"title": "t", "version": "1"}}, {servers} "paths": {{}}}}"#);
        agentos_openapi::server_path(doc.as_bytes(), &Default::default()).unwrap()
    };
    assert_eq!(with(r#""servers": [{"url": "/v1"}],"#), "/v1");
    assert_eq!(with(r#""servers": [{"url": "http://localhost:8080/api/v2/"}, {"url": "/other"}],"#), "/api/v2");
    assert_eq!(with(r#""servers": [{"url": "https://example.com"}],"#), "");
    assert_eq!(with(r#""servers": [{"url": "/"}],"#), "");
    assert_eq!(with(r#""servers": [{"url": "/{version}"}],"#), "");
    assert_eq!(
        with(
            r#""servers": [{"url": "http://localhost:{port}/{v}", "variables": {"port": {"default": "8080"}, "v": {"default": "v2"}}}],"#
        ),
        "/v2"
    );
    assert_eq!(with(r#""servers": [{"url": "/a b"}],"#), "");
    assert_eq!(with(""), "");
    let yaml = "openapi: 3.1.0\ninfo: {title: t, version: '1'}\nservers:\n  - url: /base\npaths: {}\n";
    assert_eq!(agentos_openapi::server_path(yaml.as_bytes(), &Default::default()).unwrap(), "/base");
}
