//! Test support: runs `exitscope inspect --format json` on a dump and parses its output with a
//! small JSON reader (the crate has no dependencies, so no serde).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<String, Json>),
}

impl Json {
    /// `j["a"]`-style access that names the missing key on failure.
    pub fn get(&self, key: &str) -> &Json {
        match self {
            Json::Obj(m) => m.get(key).unwrap_or_else(|| panic!("no key '{key}' in {self:?}")),
            _ => panic!("'{key}' looked up in a non-object {self:?}"),
        }
    }
    pub fn arr(&self) -> &[Json] {
        match self {
            Json::Arr(v) => v,
            _ => panic!("not an array: {self:?}"),
        }
    }
    pub fn str(&self) -> &str {
        match self {
            Json::Str(s) => s,
            _ => panic!("not a string: {self:?}"),
        }
    }
    pub fn u64(&self) -> u64 {
        match self {
            Json::Num(n) if *n >= 0.0 && n.fract() == 0.0 => *n as u64,
            _ => panic!("not a non-negative integer: {self:?}"),
        }
    }
    pub fn bool(&self) -> bool {
        match self {
            Json::Bool(b) => *b,
            _ => panic!("not a bool: {self:?}"),
        }
    }
    /// The "count" of the row whose "key" is `key` in a by_* table; 0 when there is no row.
    pub fn count_of(&self, key: &str) -> u64 {
        self.arr()
            .iter()
            .find(|r| r.get("key").str() == key)
            .map(|r| r.get("count").u64())
            .unwrap_or(0)
    }
    pub fn keys_of(&self) -> Vec<String> {
        self.arr().iter().map(|r| r.get("key").str().to_string()).collect()
    }
}

pub fn parse(text: &str) -> Json {
    let mut p = Parser { s: text.as_bytes(), i: 0 };
    let v = p.value();
    p.ws();
    assert_eq!(p.i, p.s.len(), "trailing bytes after the JSON value at {}", p.i);
    v
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) {
        self.ws();
        assert_eq!(self.s.get(self.i), Some(&c), "expected '{}' at byte {}", c as char, self.i);
        self.i += 1;
    }
    fn lit(&mut self, word: &str, v: Json) -> Json {
        assert!(self.s[self.i..].starts_with(word.as_bytes()), "bad literal at byte {}", self.i);
        self.i += word.len();
        v
    }
    fn value(&mut self) -> Json {
        self.ws();
        match self.s.get(self.i).copied() {
            Some(b'{') => {
                self.i += 1;
                let mut m = BTreeMap::new();
                self.ws();
                if self.s[self.i] == b'}' {
                    self.i += 1;
                    return Json::Obj(m);
                }
                loop {
                    self.ws();
                    let k = self.string();
                    self.eat(b':');
                    let v = self.value();
                    m.insert(k, v);
                    self.ws();
                    match self.s[self.i] {
                        b',' => self.i += 1,
                        b'}' => {
                            self.i += 1;
                            return Json::Obj(m);
                        }
                        c => panic!("expected ',' or '}}' at byte {}, got '{}'", self.i, c as char),
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut v = Vec::new();
                self.ws();
                if self.s[self.i] == b']' {
                    self.i += 1;
                    return Json::Arr(v);
                }
                loop {
                    v.push(self.value());
                    self.ws();
                    match self.s[self.i] {
                        b',' => self.i += 1,
                        b']' => {
                            self.i += 1;
                            return Json::Arr(v);
                        }
                        c => panic!("expected ',' or ']' at byte {}, got '{}'", self.i, c as char),
                    }
                }
            }
            Some(b'"') => Json::Str(self.string()),
            Some(b't') => self.lit("true", Json::Bool(true)),
            Some(b'f') => self.lit("false", Json::Bool(false)),
            Some(b'n') => self.lit("null", Json::Null),
            Some(_) => {
                let start = self.i;
                while self.i < self.s.len() && b"+-.eE0123456789".contains(&self.s[self.i]) {
                    self.i += 1;
                }
                let t = std::str::from_utf8(&self.s[start..self.i]).unwrap();
                Json::Num(t.parse().unwrap_or_else(|_| panic!("bad number '{t}' at byte {start}")))
            }
            None => panic!("unexpected end of JSON"),
        }
    }
    fn string(&mut self) -> String {
        assert_eq!(self.s[self.i], b'"', "expected a string at byte {}", self.i);
        self.i += 1;
        let mut out = Vec::new();
        loop {
            let c = self.s[self.i];
            self.i += 1;
            match c {
                b'"' => return String::from_utf8(out).expect("JSON string is UTF-8"),
                b'\\' => {
                    let e = self.s[self.i];
                    self.i += 1;
                    let ch = match e {
                        b'n' => '\n',
                        b't' => '\t',
                        b'r' => '\r',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'u' => {
                            let hex = std::str::from_utf8(&self.s[self.i..self.i + 4]).unwrap();
                            self.i += 4;
                            char::from_u32(u32::from_str_radix(hex, 16).unwrap())
                                .unwrap_or('\u{fffd}')
                        }
                        other => other as char,
                    };
                    let mut b = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut b).as_bytes());
                }
                _ => out.push(c),
            }
        }
    }
}

/// The exitscope binary: $EXITSCOPE_BIN, else `exitscope` beside the library's folder
/// ($EXITSCOPE_LIB_DIR/..), else build/exitscope of the source tree.
pub fn exitscope_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("EXITSCOPE_BIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if let Some(d) = std::env::var_os("EXITSCOPE_LIB_DIR").filter(|p| !p.is_empty()) {
        let p = Path::new(&d).join("../exitscope");
        if p.is_file() {
            return p;
        }
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build/exitscope")
}

/// `exitscope inspect --format json DUMP`, parsed; panics with its stderr if it fails.
pub fn inspect(dump: &Path) -> Json {
    let bin = exitscope_bin();
    let out = Command::new(&bin)
        .args(["inspect", "--format", "json", "--all"])
        .arg(dump)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} (set EXITSCOPE_BIN): {e}", bin.display()));
    assert!(
        out.status.success(),
        "{} inspect {} failed ({}): {}",
        bin.display(),
        dump.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    parse(std::str::from_utf8(&out.stdout).expect("inspect output is UTF-8"))
}

/// A fresh path for a test's dump under Cargo's scratch folder for integration tests.
pub fn dump_path(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let p = dir.join(format!("{name}-{}.esdump", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// Polls `cond` every millisecond for up to `secs` seconds (waits for an event, not a time).
pub fn wait_for(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    cond()
}
