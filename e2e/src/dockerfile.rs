//! A reader of the project's `Dockerfile`: its stages and their instructions, enough to check
//! the image's layout against the binaries and the chart (`e2e/tests/image.rs`) and to build the
//! image without a registry by following its final stage ([`crate::images::operator`]).

use std::collections::BTreeMap;

/// One instruction of a Dockerfile: its keyword (upper case) and the rest of the line (the
/// continuation lines joined).
#[derive(Debug, Clone)]
pub struct Instruction {
    /// `FROM`, `COPY`, `ENV`, ...
    pub keyword: String,
    /// What follows the keyword.
    pub rest: String,
}

/// The project's `Dockerfile`, read from the repository root.
pub fn read() -> std::io::Result<String> {
    std::fs::read_to_string(crate::repo_root().join("Dockerfile"))
}

/// The stages of a Dockerfile, each a list of instructions starting with its FROM.
pub fn stages(text: &str) -> Vec<Vec<Instruction>> {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(trimmed);
        logical.push(std::mem::take(&mut current));
    }
    let mut stages: Vec<Vec<Instruction>> = Vec::new();
    for line in logical {
        let (keyword, rest) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
        let instruction = Instruction {
            keyword: keyword.to_ascii_uppercase(),
            rest: rest.trim().to_string(),
        };
        if instruction.keyword == "FROM" {
            stages.push(Vec::new());
        }
        if let Some(stage) = stages.last_mut() {
            stage.push(instruction);
        }
    }
    stages
}

/// The arguments of every `keyword` instruction of `stage`, in order.
pub fn all<'a>(stage: &'a [Instruction], keyword: &'a str) -> impl Iterator<Item = &'a str> {
    stage
        .iter()
        .filter(move |i| i.keyword == keyword)
        .map(|i| i.rest.as_str())
}

/// `KEY=value` pairs of the stage's ENV instructions.
pub fn env(stage: &[Instruction]) -> BTreeMap<String, String> {
    env_in_order(stage).into_iter().collect()
}

/// `KEY=value` pairs of the stage's ENV instructions, in the order they are written.
pub fn env_in_order(stage: &[Instruction]) -> Vec<(String, String)> {
    all(stage, "ENV")
        .flat_map(|rest| rest.split_whitespace())
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `key="value"` pairs of the stage's LABEL instructions (quotes removed).
pub fn labels(stage: &[Instruction]) -> Vec<(String, String)> {
    all(stage, "LABEL")
        .flat_map(|rest| rest.split_whitespace())
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
        .collect()
}

/// `(--from stage, source, destination)` of the stage's COPY instructions.
pub fn copies(stage: &[Instruction]) -> Vec<(String, String, String)> {
    all(stage, "COPY")
        .map(|rest| {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let from = words
                .iter()
                .find_map(|w| w.strip_prefix("--from="))
                .unwrap_or_default()
                .to_string();
            let plain: Vec<&str> = words
                .iter()
                .copied()
                .filter(|w| !w.starts_with("--"))
                .collect();
            let dest = plain.last().copied().unwrap_or_default().to_string();
            let source = plain.first().copied().unwrap_or_default().to_string();
            (from, source, dest)
        })
        .collect()
}

/// The words of an exec-form instruction (`["a", "b"]`), such as ENTRYPOINT's.
pub fn exec_form(rest: &str) -> Option<Vec<String>> {
    serde_json::from_str(rest).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_join_continuations_and_split_into_stages() {
        let text = "FROM a AS one\nRUN x \\\n  && y\n# note\nFROM b\nENV A=1 \\\n    B=2\nLABEL k=\"v\" j=\"u\"\nENTRYPOINT [\"/bin/c\"]\n";
        let s = stages(text);
        assert_eq!(s.len(), 2);
        assert_eq!(all(&s[0], "RUN").collect::<Vec<_>>(), ["x  && y"]);
        assert_eq!(
            env_in_order(&s[1]),
            [("A".into(), "1".into()), ("B".into(), "2".into())]
        );
        assert_eq!(labels(&s[1])[1], ("j".into(), "u".into()));
        assert_eq!(
            exec_form(all(&s[1], "ENTRYPOINT").next().expect("ENTRYPOINT")),
            Some(vec!["/bin/c".to_string()])
        );
    }
}
