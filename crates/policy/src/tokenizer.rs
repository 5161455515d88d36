//! The word-level tokenizer of language-conditioned policies (docs/policy.md, "Language
//! conditioning"): a vocabulary built from a dataset's task strings, and the encoding of one
//! instruction into a fixed number of token ids with a padding mask.
//!
//! Words are the maximal runs of alphanumeric characters, lowercased ("Pick up the RED cube!"
//! -> `pick`, `up`, `the`, `red`, `cube`). Id 0 is `<pad>`, id 1 is `<unk>` (a word the
//! vocabulary lacks, in lenient mode), the dataset's words follow in sorted order, so the same
//! task strings always give the same ids.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// What is wrong with an instruction or a vocabulary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// The instruction has no words.
    #[error(
        "the instruction {text:?} is empty: this policy is language-conditioned and needs a task \
         instruction (e.g. the one its demonstrations were recorded with)"
    )]
    Empty {
        /// The instruction as given.
        text: String,
    },
    /// The instruction has more words than the encoder reads.
    #[error(
        "the instruction has {words} words, more than this policy reads (max_tokens = {max}, \
         [policy.encoder.text]): {text:?}"
    )]
    TooLong {
        /// The instruction as given.
        text: String,
        /// Its number of words.
        words: usize,
        /// The limit.
        max: usize,
    },
    /// Strict mode: words the vocabulary does not hold.
    #[error(
        "unknown word(s) {} in the instruction {text:?}: this policy's vocabulary holds the {size} \
         words of its training tasks",
        quoted(words)
    )]
    Unknown {
        /// The instruction as given.
        text: String,
        /// The unknown words, in order of appearance, each once.
        words: Vec<String>,
        /// Vocabulary size (including `<pad>` and `<unk>`).
        size: usize,
    },
    /// A vocabulary whose token list is not one this module writes.
    #[error("invalid vocabulary: {0}")]
    Vocabulary(String),
}

fn quoted(words: &[String]) -> String {
    words
        .iter()
        .map(|w| format!("'{w}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The words of `text`: lowercased runs of alphanumeric characters.
pub fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Token ids of the words of a dataset's tasks: `<pad>` = 0, `<unk>` = 1, then the words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "VocabularyFile", into = "VocabularyFile")]
pub struct Vocabulary {
    tokens: Vec<String>,
    index: HashMap<String, u32>,
}

/// The on-disk form of a [`Vocabulary`] (`vocab.json` of a checkpoint).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct VocabularyFile {
    /// Every token, its id being its position.
    tokens: Vec<String>,
}

impl Vocabulary {
    /// Id of the padding token.
    pub const PAD: u32 = 0;
    /// Id of the unknown-word token.
    pub const UNK: u32 = 1;
    /// The padding token.
    pub const PAD_TOKEN: &str = "<pad>";
    /// The unknown-word token.
    pub const UNK_TOKEN: &str = "<unk>";

    /// The vocabulary of the words of `texts` (sorted, each once).
    pub fn from_texts<'a>(texts: impl IntoIterator<Item = &'a str>) -> Self {
        let words: BTreeSet<String> = texts.into_iter().flat_map(words).collect();
        let tokens = [Self::PAD_TOKEN, Self::UNK_TOKEN]
            .into_iter()
            .map(str::to_owned)
            .chain(words)
            .collect();
        Self::from_tokens(tokens).expect("words are alphanumeric and distinct")
    }

    /// A vocabulary from its token list (as stored): `<pad>`, `<unk>`, then distinct words.
    pub fn from_tokens(tokens: Vec<String>) -> Result<Self, TextError> {
        let bad = |m: String| Err(TextError::Vocabulary(m));
        if tokens.first().map(String::as_str) != Some(Self::PAD_TOKEN)
            || tokens.get(1).map(String::as_str) != Some(Self::UNK_TOKEN)
        {
            return bad(format!(
                "the first two tokens must be {} and {}",
                Self::PAD_TOKEN,
                Self::UNK_TOKEN
            ));
        }
        let mut index = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            if i >= 2 && words(t) != [t.clone()] {
                return bad(format!(
                    "token {i} ({t:?}) is not one lowercase alphanumeric word"
                ));
            }
            let id =
                u32::try_from(i).map_err(|_| TextError::Vocabulary("too many tokens".into()))?;
            if index.insert(t.clone(), id).is_some() {
                return bad(format!("token {t:?} appears twice"));
            }
        }
        Ok(Self { tokens, index })
    }

    /// Number of tokens, `<pad>` and `<unk>` included (the rows of the token embedding).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether it holds no word besides `<pad>` and `<unk>`.
    pub fn is_empty(&self) -> bool {
        self.tokens.len() <= 2
    }

    /// Every token, its id being its position.
    pub fn tokens(&self) -> &[String] {
        &self.tokens
    }

    /// The id of `word` (already lowercased), if the vocabulary holds it.
    pub fn id(&self, word: &str) -> Option<u32> {
        self.index.get(word).copied()
    }
}

impl TryFrom<VocabularyFile> for Vocabulary {
    type Error = TextError;
    fn try_from(f: VocabularyFile) -> Result<Self, TextError> {
        Self::from_tokens(f.tokens)
    }
}

impl From<Vocabulary> for VocabularyFile {
    fn from(v: Vocabulary) -> Self {
        Self { tokens: v.tokens }
    }
}

/// One encoded instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tokens {
    /// `max_tokens` ids: the words', then `<pad>`.
    pub ids: Vec<u32>,
    /// `max_tokens` flags, true at padding positions (Burn's `mask_pad` convention).
    pub pad: Vec<bool>,
}

/// Whether words outside the vocabulary are refused or read as `<unk>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strictness {
    /// Unknown words are an error (serving, evaluation, rollouts: the policy never saw them).
    Strict,
    /// Unknown words become `<unk>` (training data).
    Lenient,
}

/// A vocabulary and the number of tokens the text encoder reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tokenizer {
    vocab: Arc<Vocabulary>,
    max_tokens: usize,
}

impl Tokenizer {
    /// Encodes instructions of at most `max_tokens` words with `vocab`.
    pub fn new(vocab: Vocabulary, max_tokens: usize) -> Self {
        Self {
            vocab: Arc::new(vocab),
            max_tokens,
        }
    }

    /// The vocabulary.
    pub fn vocabulary(&self) -> &Vocabulary {
        &self.vocab
    }

    /// Ids (and mask entries) per instruction.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// `text` as `max_tokens` ids and its padding mask. Fails on an instruction without words,
    /// with more than `max_tokens` words, or (strict) with words outside the vocabulary.
    pub fn encode(&self, text: &str, mode: Strictness) -> Result<Tokens, TextError> {
        let ws = words(text);
        if ws.is_empty() {
            return Err(TextError::Empty { text: text.into() });
        }
        if ws.len() > self.max_tokens {
            return Err(TextError::TooLong {
                text: text.into(),
                words: ws.len(),
                max: self.max_tokens,
            });
        }
        let mut unknown: Vec<String> = Vec::new();
        let mut ids: Vec<u32> = ws
            .iter()
            .map(|w| {
                self.vocab.id(w).unwrap_or_else(|| {
                    if !unknown.contains(w) {
                        unknown.push(w.clone());
                    }
                    Vocabulary::UNK
                })
            })
            .collect();
        if mode == Strictness::Strict && !unknown.is_empty() {
            return Err(TextError::Unknown {
                text: text.into(),
                words: unknown,
                size: self.vocab.len(),
            });
        }
        let n = ids.len();
        ids.resize(self.max_tokens, Vocabulary::PAD);
        let pad = (0..self.max_tokens).map(|i| i >= n).collect();
        Ok(Tokens { ids, pad })
    }

    /// The words of `tokens` (padding dropped), for messages and round trips.
    pub fn decode(&self, tokens: &Tokens) -> Vec<String> {
        tokens
            .ids
            .iter()
            .zip(&tokens.pad)
            .filter(|(_, pad)| !**pad)
            .map(|(&id, _)| {
                self.vocab
                    .tokens
                    .get(id as usize)
                    .cloned()
                    .unwrap_or_else(|| Vocabulary::UNK_TOKEN.into())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        Tokenizer::new(
            Vocabulary::from_texts(["Go left.", "go RIGHT", "pick up the red-cube"]),
            4,
        )
    }

    #[test]
    fn vocabulary_is_sorted_lowercase_words_after_pad_and_unk() {
        let t = tokenizer();
        assert_eq!(
            t.vocabulary().tokens(),
            [
                "<pad>", "<unk>", "cube", "go", "left", "pick", "red", "right", "the", "up"
            ]
        );
        assert_eq!(
            words("Pick up the RED cube!"),
            ["pick", "up", "the", "red", "cube"]
        );
    }

    #[test]
    fn encode_pads_and_masks_and_round_trips() {
        let t = tokenizer();
        let tok = t.encode("  Go, LEFT ", Strictness::Strict).unwrap();
        assert_eq!(tok.ids, vec![3, 4, 0, 0]);
        assert_eq!(tok.pad, vec![false, false, true, true]);
        assert_eq!(t.decode(&tok), ["go", "left"]);
        // Exactly max_tokens words: no padding.
        let full = t.encode("pick up the cube", Strictness::Strict).unwrap();
        assert!(full.pad.iter().all(|p| !p));
        assert_eq!(t.decode(&full).join(" "), "pick up the cube");
    }

    #[test]
    fn bad_instructions_are_named() {
        let t = tokenizer();
        let long = t
            .encode("pick up the red cube", Strictness::Lenient)
            .unwrap_err();
        assert!(matches!(
            long,
            TextError::TooLong {
                words: 5,
                max: 4,
                ..
            }
        ));
        assert!(long.to_string().contains("max_tokens = 4"), "{long}");
        for empty in ["", "  ", "?!"] {
            let e = t.encode(empty, Strictness::Lenient).unwrap_err();
            assert!(matches!(e, TextError::Empty { .. }), "{e}");
            assert!(e.to_string().contains("empty"), "{e}");
        }
        let e = t
            .encode("go up to the blue blue ball", Strictness::Strict)
            .unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, TextError::TooLong { .. }), "{msg}");
        let e = t
            .encode("go blue Ball blue", Strictness::Strict)
            .unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(&e, TextError::Unknown { words, .. } if words == &["blue", "ball"]),
            "{msg}"
        );
        assert!(
            msg.contains("'blue', 'ball'") && msg.contains("10 words"),
            "{msg}"
        );
        // Lenient: unknown words read as <unk>.
        let tok = t.encode("go blue", Strictness::Lenient).unwrap();
        assert_eq!(tok.ids[..2], [3, Vocabulary::UNK]);
    }

    #[test]
    fn stored_vocabularies_are_checked() {
        let v = tokenizer().vocabulary().clone();
        let json = serde_json::to_string(&v).unwrap();
        assert!(
            json.starts_with(r#"{"tokens":["<pad>","<unk>","cube""#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<Vocabulary>(&json).unwrap(), v);
        for bad in [
            r#"{"tokens":["<unk>","<pad>","go"]}"#,
            r#"{"tokens":["<pad>","<unk>","go","go"]}"#,
            r#"{"tokens":["<pad>","<unk>","Go Left"]}"#,
            r#"{"words":["<pad>","<unk>"]}"#,
        ] {
            assert!(serde_json::from_str::<Vocabulary>(bad).is_err(), "{bad}");
        }
    }
}
