//! GBNF (llama.cpp's EBNF, which vLLM's xgrammar backend takes as `grammar`) written as the
//! Lark that llguidance compiles.
//!
//! `name ::= alternatives` rules, `root` the start; string literals `"..."` and character
//! classes `[a-z]` / `[^"\\]` with llama.cpp's escapes (`\n \r \t \\ \" \xHH \uHHHH
//! \UHHHHHHHH`, and `\] \[ \-` in classes); `.` any character; grouping, `|`, `* + ?`,
//! `{m}`, `{m,}`, `{m,n}`; `#` comments. A rule ends where the next `name ::=` begins.
//!
//! Each rule becomes a Lark rule named `g<i>_<name>` (Lark rule names are lower case; GBNF's
//! may not be), strings become JSON-escaped Lark strings, classes and `.` become regexes, and
//! `start: g<i>_root` opens the grammar.

use std::collections::HashMap;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Name(String),
    Define,
    Str(String),
    /// A regex already written for Lark's `/.../`.
    Regex(String),
    /// `( ) | * + ?` and a whole `{m,n}`, copied as they are.
    Op(String),
}

/// Whether `src` reads as GBNF rather than Lark: it defines a rule with `::=`, which Lark
/// never writes.
pub fn looks_like_gbnf(src: &str) -> bool {
    src.lines().any(|l| {
        let l = l.trim_start();
        let name_end = l.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_')).unwrap_or(l.len());
        name_end > 0 && l[name_end..].trim_start().starts_with("::=")
    })
}

/// The Lark grammar of a GBNF one, or why it is not GBNF.
pub fn to_lark(src: &str) -> Result<String, String> {
    let toks = lex(src)?;
    // Rule heads: a name followed by `::=`.
    let mut heads = Vec::new();
    for i in 0..toks.len() {
        if toks[i] == Tok::Define {
            match i.checked_sub(1).map(|j| &toks[j]) {
                Some(Tok::Name(_)) => heads.push(i - 1),
                _ => return Err("`::=` must follow a rule name".into()),
            }
        }
    }
    if heads.first() != Some(&0) {
        return Err("a GBNF grammar starts with a rule: `name ::= ...`".into());
    }
    let mut names: HashMap<String, String> = HashMap::new();
    for (i, &h) in heads.iter().enumerate() {
        let Tok::Name(n) = &toks[h] else { unreachable!("heads are names") };
        if names.contains_key(n) {
            return Err(format!("rule `{n}` is defined twice"));
        }
        let clean: String =
            n.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect();
        names.insert(n.clone(), format!("g{i}_{clean}"));
    }
    let Some(root) = names.get("root") else { return Err("a GBNF grammar needs a `root` rule".into()) };
    let mut out = format!("start: {root}\n");
    for (i, &h) in heads.iter().enumerate() {
        let Tok::Name(n) = &toks[h] else { unreachable!("heads are names") };
        let end = heads.get(i + 1).copied().unwrap_or(toks.len());
        let body = &toks[h + 2..end];
        if body.is_empty() {
            return Err(format!("rule `{n}` is empty"));
        }
        out.push_str(&names[n]);
        out.push(':');
        for t in body {
            // Quantifiers stay on what they repeat.
            if !matches!(t, Tok::Op(o) if o == "*" || o == "+" || o == "?" || o.starts_with('{')) {
                out.push(' ');
            }
            match t {
                Tok::Name(r) => {
                    out.push_str(names.get(r).ok_or_else(|| format!("rule `{r}` is used but not defined"))?)
                }
                Tok::Str(s) => out.push_str(&serde_json::to_string(s).expect("a string serialises")),
                Tok::Regex(r) => {
                    out.push('/');
                    out.push_str(r);
                    out.push('/');
                }
                Tok::Op(o) => out.push_str(o),
                Tok::Define => unreachable!("bodies end before the next head"),
            }
        }
        out.push('\n');
    }
    Ok(out)
}

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    let cs: Vec<char> = src.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < cs.len() {
        let c = cs[i];
        match c {
            _ if c.is_whitespace() => i += 1,
            '#' => {
                while i < cs.len() && cs[i] != '\n' {
                    i += 1;
                }
            }
            ':' if cs[i..].starts_with(&[':', ':', '=']) => {
                toks.push(Tok::Define);
                i += 3;
            }
            '"' => {
                let mut s = String::new();
                i += 1;
                loop {
                    match cs.get(i) {
                        None => return Err("a string is not closed".into()),
                        Some('"') => break,
                        Some('\\') => {
                            let (ch, n) = escape(&cs[i..])?;
                            s.push(ch);
                            i += n;
                        }
                        Some(&ch) => {
                            s.push(ch);
                            i += 1;
                        }
                    }
                }
                i += 1;
                toks.push(Tok::Str(s));
            }
            '[' => {
                let mut rx = String::from("[");
                i += 1;
                if cs.get(i) == Some(&'^') {
                    rx.push('^');
                    i += 1;
                }
                let mut empty = true;
                loop {
                    match cs.get(i) {
                        None => return Err("a character class is not closed".into()),
                        Some(']') if !empty => break,
                        Some('-') if !empty && cs.get(i + 1) != Some(&']') => {
                            rx.push('-');
                            i += 1;
                        }
                        Some('\\') => {
                            let (ch, n) = escape(&cs[i..])?;
                            class_char(&mut rx, ch);
                            i += n;
                            empty = false;
                        }
                        Some(&ch) => {
                            class_char(&mut rx, ch);
                            i += 1;
                            empty = false;
                        }
                    }
                }
                i += 1;
                rx.push(']');
                toks.push(Tok::Regex(rx));
            }
            '.' => {
                toks.push(Tok::Regex("(?s:.)".into()));
                i += 1;
            }
            '(' | ')' | '|' | '*' | '+' | '?' => {
                toks.push(Tok::Op(c.to_string()));
                i += 1;
            }
            '{' => {
                let close = cs[i..].iter().position(|&x| x == '}').ok_or("a `{` repeat is not closed")?;
                let inner: String = cs[i + 1..i + close].iter().filter(|c| !c.is_whitespace()).collect();
                let ok = !inner.is_empty()
                    && inner.chars().all(|c| c.is_ascii_digit() || c == ',')
                    && inner.matches(',').count() <= 1
                    && !inner.starts_with(',');
                if !ok {
                    return Err(format!("`{{{inner}}}` is not a repeat (`{{m}}`, `{{m,}}` or `{{m,n}}`)"));
                }
                toks.push(Tok::Op(format!("{{{inner}}}")));
                i += close + 1;
            }
            _ if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let start = i;
                while i < cs.len() && (cs[i].is_ascii_alphanumeric() || cs[i] == '-' || cs[i] == '_') {
                    i += 1;
                }
                toks.push(Tok::Name(cs[start..i].iter().collect()));
            }
            _ => return Err(format!("unexpected `{c}`")),
        }
    }
    Ok(toks)
}

/// One escape at the start of `s` (which begins with `\`): the character and its length.
fn escape(s: &[char]) -> Result<(char, usize), String> {
    let hex = |n: usize| -> Result<(char, usize), String> {
        let digits: String = s.iter().skip(2).take(n).collect();
        let v = u32::from_str_radix(&digits, 16)
            .ok()
            .filter(|_| digits.len() == n)
            .ok_or_else(|| format!("bad escape `\\{}{digits}`", s[1]))?;
        char::from_u32(v).map(|c| (c, 2 + n)).ok_or_else(|| format!("escape `\\{}{digits}` is not a character", s[1]))
    };
    match s.get(1) {
        Some('n') => Ok(('\n', 2)),
        Some('r') => Ok(('\r', 2)),
        Some('t') => Ok(('\t', 2)),
        Some('x') => hex(2),
        Some('u') => hex(4),
        Some('U') => hex(8),
        Some(&c @ ('\\' | '"' | '[' | ']' | '-' | '/' | '\'')) => Ok((c, 2)),
        Some(c) => Err(format!("unknown escape `\\{c}`")),
        None => Err("a `\\` ends the grammar".into()),
    }
}

/// A literal character inside a regex class, escaped where the class or Lark's `/` would
/// read it otherwise.
fn class_char(rx: &mut String, c: char) {
    match c {
        '\\' | ']' | '[' | '^' | '-' | '&' | '~' | '/' => {
            rx.push('\\');
            rx.push(c);
        }
        _ if c.is_control() || c.is_whitespace() => rx.push_str(&format!("\\x{{{:X}}}", c as u32)),
        _ => rx.push(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_strings_classes_and_repeats() {
        let g = "root ::= answer # a comment\nanswer ::= \"yes\" | \"no\" | [0-9]{1,3} item-list\nitem-list ::= ( [^\"\\\\\\n] . )* \"\\x41\\\"\"?\n";
        assert!(looks_like_gbnf(g));
        let lark = to_lark(g).unwrap();
        assert_eq!(
            lark,
            "start: g0_root\ng0_root: g1_answer\ng1_answer: \"yes\" | \"no\" | /[0-9]/{1,3} g2_item_list\ng2_item_list: ( /[^\"\\\\\\x{A}]/ /(?s:.)/ )* \"A\\\"\"?\n"
        );
        assert!(!looks_like_gbnf("start: \"a\" | \"b\"\n"));
    }

    #[test]
    fn bad_grammars_say_why() {
        for (g, why) in [
            ("root ::= x", "`x` is used but not defined"),
            ("a ::= \"x\"", "needs a `root`"),
            ("root ::= \"x", "not closed"),
            ("root ::= [a-z", "not closed"),
            ("root ::= \"a\"{x}", "not a repeat"),
            ("root ::= \"\\q\"", "unknown escape"),
            ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
            ("\"a\" root ::= \"b\"", "starts with a rule"),
        ] {
            let e = to_lark(g).unwrap_err();
            assert!(e.contains(why), "{g}: {e}");
        }
    }
}
