//! Prepare: split off confidential fields, chunk, count, embed and index
//! a context once, reused by every task asked of it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::{Counting, Scd, SelectedChunk, EMBED_SLICE, EMBED_SLICE_BYTES};
use crate::budget::{BudgetTokenizer, CHUNK_SEPARATOR};
use crate::cache::{is_unit_vector, EmbeddingCache};
use crate::cancel::Cancel;
use crate::chunk::chunk_field;
use crate::context::{Context, Field, FieldKind};
use crate::encoder::{EncodeOptions, InputKind};
use crate::index::HnswIndex;
use crate::score::{dedup, dot, Bm25};
use crate::{Error, Param, Result};

#[derive(Clone)]
pub(super) struct Prepared {
    pub(super) field: usize,
    pub(super) id: String,
    pub(super) span: (usize, usize),
    pub(super) text: String,
    pub(super) group: (usize, usize),
    pub(super) lead: bool,
    /// Structure only ([`crate::chunk::RawChunk::rides`]): sent with a
    /// member of its group, never alone.
    pub(super) rides: bool,
    pub(super) tokens: usize,
    pub(super) embedding: Arc<[f32]>,
    pub(super) embed_text: String,
    /// Names this chunk defines (functions, tables, JSON keys): link targets.
    pub(super) defines: Vec<String>,
    /// Lower-cased text, for mention matching.
    pub(super) lower: String,
    /// Dropped-manifest stub.
    pub(super) stub: String,
    /// Which chunker cut it ([`crate::chunk::RawChunk::chunker`]).
    pub(super) chunker: &'static str,
    /// 1-based first and last line of the span in its field.
    pub(super) lines: (usize, usize),
    /// The whitespace between the start of its first line and the span
    /// (a code line's indentation), put back when it opens a piece.
    pub(super) indent: String,
    /// The chunk before it in its field's reading order.
    pub(super) prev: Option<usize>,
    /// The chunk after it in its field's reading order.
    pub(super) next: Option<usize>,
    /// The text between `prev` and it when that is only whitespace: the two
    /// read as one piece with it between them.
    pub(super) gap: Option<String>,
    /// The section (a markdown heading) or JSON path in force, for the
    /// piece's header.
    pub(super) section: Option<String>,
    /// A JSON chunk's wrapping that makes it parse on its own (`{}` around
    /// object members, `[]` around array elements, nothing for a value),
    /// and the part of its text it wraps.
    pub(super) wrap: Option<crate::chunk::json::Wrap>,
    /// A JSON chunk's containers cut across several chunks (the first and
    /// last chunk each spans), innermost first: what packing may send whole.
    pub(super) containers: Vec<(usize, usize)>,
    /// A log chunk's severity: 3 a raised exception's line, 2 another error,
    /// 1 a warning, 0 neither (or not a log).
    pub(super) severity: u8,
}

impl Prepared {
    /// Whether a code chunker cut it (a parser's or the line heuristic's).
    pub(super) fn is_code(&self) -> bool {
        self.chunker.starts_with("tree-sitter") || self.chunker.ends_with("code")
    }
}

/// The non-confidential part of a context chunked, counted, embedded and
/// indexed once, reused by every task asked of it. Confidential fields never
/// reach it: they are split off before, so nothing here (the encoder, the
/// caches, BM25, links, sessions) ever sees their text.
pub(super) struct PreparedContext {
    pub(super) chunks: Vec<Prepared>,
    pub(super) field_names: Vec<String>,
    /// Per field, its kind.
    pub(super) field_kinds: Vec<FieldKind>,
    /// Per field: its title's mention key when it is a titled document.
    pub(super) field_keys: Vec<Option<String>>,
    /// Per field, its last line (1-based), found once here so rendering
    /// (done once per chunk the fit drops and per refill candidate) does
    /// not walk every chunk again: a field of one line gets headers that
    /// name no lines.
    pub(super) last_lines: Vec<usize>,
    pub(super) bm25: Bm25,
    pub(super) index: Option<HnswIndex>,
    /// Per chunk, its distinct embedding (bit-identical chunks, such as a
    /// repeated log line, share one): an index into `near_duplicates`.
    pub(super) distinct: Vec<u32>,
    /// Per distinct embedding, the other distinct ones at least
    /// `redundancy_cosine` similar to it. Identical chunks are one entry, so
    /// a thousand copies of a line cost one, not a million pairs.
    pub(super) near_duplicates: Vec<Vec<u32>>,
    /// Fingerprint of the fields it was built from (model + public fields).
    pub(super) key: [u8; 32],
    /// About how much memory it holds.
    pub(super) bytes: usize,
    /// The lead (the signature) of each function the code chunker cut into
    /// a signature and body pieces, by group; none when
    /// `long_function_bytes` is 0.
    pub(super) cut_functions: HashMap<(usize, usize), usize>,
}

impl PreparedContext {
    /// The chunks of each cut function (its signature, body pieces and
    /// closing line; see [`Self::cut_functions`]), by group, in order.
    pub(super) fn cut_function_chunks(&self) -> HashMap<(usize, usize), Vec<usize>> {
        let mut by_group: HashMap<(usize, usize), Vec<usize>> = HashMap::new();
        for (i, c) in self.chunks.iter().enumerate().filter(|(_, c)| self.cut_functions.contains_key(&c.group)) {
            by_group.entry(c.group).or_default().push(i);
        }
        by_group
    }

    /// Whether field `f` is prose (a document: only prose fields have a
    /// title key). The second hop and paragraph closure work on these only.
    pub(super) fn is_prose(&self, f: usize) -> bool {
        self.field_keys[f].is_some()
    }

    /// Chunk `i` as sent to the receiver, with its score and its count in
    /// the budget tokenizer.
    pub(super) fn selected(&self, i: usize, score: f32, tokens: usize) -> SelectedChunk {
        let c = &self.chunks[i];
        SelectedChunk {
            field: self.field_names[c.field].clone(),
            id: c.id.clone(),
            span: c.span,
            text: c.text.clone(),
            score,
            tokens,
            chunker: c.chunker,
        }
    }
}

/// Each chunk's JSON containers cut across several chunks ([`Prepared::containers`]),
/// for the chunks of one field (`base` the first's index), when every one
/// of them is a JSON subtree.
fn json_containers(field: &mut [Prepared], base: usize) {
    if field.is_empty() || field.iter().any(|c| c.wrap.is_none()) {
        return;
    }
    let texts: Vec<&str> = field.iter().map(|c| c.text.as_str()).collect();
    for (s, e) in crate::chunk::json::containers(&texts) {
        for c in &mut field[s..=e] {
            c.containers.push((base + s, base + e));
        }
    }
}

/// A context with its confidential fields split off: `public` is all any
/// later stage sees; `withheld` are the confidential fields' names.
pub(super) struct Split<'a> {
    pub(super) public: Vec<&'a Field>,
    pub(super) withheld: Vec<String>,
}

impl<'a> Split<'a> {
    pub(super) fn new(ctx: &'a Context) -> Self {
        let (public, secret): (Vec<&Field>, Vec<&Field>) = ctx.fields.iter().partition(|f| !f.confidential);
        Self { public, withheld: secret.into_iter().map(|f| f.name.clone()).collect() }
    }

    /// Position of public field `name`; confidential or unknown names are
    /// errors naming `what` (the requirement list).
    pub(super) fn index(&self, names: &HashMap<&str, usize>, name: &str, what: Param) -> Result<usize> {
        match names.get(name) {
            Some(&i) => Ok(i),
            None if self.withheld.iter().any(|w| w == name) => Err(Error::invalid(
                what.clone(),
                format!("field {} is confidential and is never sent", crate::context::shown_name(name)),
            )),
            None => Err(Error::invalid(what, format!("unknown field {}", crate::context::shown_name(name)))),
        }
    }
}

/// For each vector, the index of its distinct value (bit-identical vectors
/// share one), and the first vector of each distinct value.
fn distinct_vectors(vectors: &[&[f32]]) -> (Vec<u32>, Vec<usize>) {
    use sha2::{Digest, Sha256};
    let mut first: HashMap<[u8; 32], u32> = HashMap::new();
    let mut unique = Vec::new();
    let distinct = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let mut h = Sha256::new();
            v.iter().for_each(|x| h.update(x.to_le_bytes()));
            *first.entry(h.finalize().into()).or_insert_with(|| {
                unique.push(i);
                (unique.len() - 1) as u32
            })
        })
        .collect();
    (distinct, unique)
}

/// The first `words` words of `text`, with `…` when there are more.
fn stub(text: &str, words: usize) -> String {
    let first: Vec<&str> = text.split_whitespace().take(words).collect();
    let mut s = first.join(" ");
    if text.split_whitespace().count() > words {
        s.push('…');
    }
    s
}

/// Lower-cased `name` without a trailing parenthetical, for mention matching.
fn mention_key(name: &str) -> String {
    let base = name.split(" (").next().unwrap_or(name);
    base.trim().to_lowercase()
}

/// Consecutive runs of `items`, each of at most [`EMBED_SLICE`] items and
/// [`EMBED_SLICE_BYTES`] bytes (`bytes` of an item), an item over the bytes
/// alone in its run.
fn slices(items: &[usize], bytes: impl Fn(usize) -> usize) -> Vec<&[usize]> {
    let mut out = Vec::new();
    let (mut start, mut size) = (0, 0);
    for (k, &i) in items.iter().enumerate() {
        let b = bytes(i);
        if k > start && (k - start == EMBED_SLICE || size + b > EMBED_SLICE_BYTES) {
            out.push(&items[start..k]);
            (start, size) = (k, 0);
        }
        size += b;
    }
    if start < items.len() {
        out.push(&items[start..]);
    }
    out
}

impl Scd {
    /// Embeds texts through the cache; only misses reach the encoder.
    pub fn embed_cached(&self, texts: &[&str], kind: InputKind) -> Result<Vec<Arc<[f32]>>> {
        self.embed_cached_with(texts, kind, &Cancel::new())
    }

    /// [`Scd::embed_cached`], checking `cancel` before each encoder call of
    /// at most [`EMBED_SLICE`] texts and [`EMBED_SLICE_BYTES`] bytes (and
    /// inside it, between the encoder's own batches).
    pub fn embed_cached_with(&self, texts: &[&str], kind: InputKind, cancel: &Cancel) -> Result<Vec<Arc<[f32]>>> {
        let kind_byte = u8::from(kind == InputKind::Query);
        let keys: Vec<_> = texts.iter().map(|t| EmbeddingCache::key(self.encoder.model_id(), kind_byte, t)).collect();
        let mut out = self.cache.get_many(&keys);
        let missing: Vec<usize> = (0..texts.len()).filter(|&i| out[i].is_none()).collect();
        if kind == InputKind::Passage {
            self.check_encoder_spend(texts, &missing)?;
        }
        for slice in slices(&missing, |i| texts[i].len()) {
            cancel.check("embed")?;
            let refs: Vec<&str> = slice.iter().map(|&i| texts[i]).collect();
            let enc = self.encoder.encode_cancellable(&refs, &EncodeOptions::new(kind).with_windows(), cancel)?;
            self.encoded[0].fetch_add(refs.len() as u64, std::sync::atomic::Ordering::Relaxed);
            self.encoded[1].fetch_add(enc.tokens.iter().sum::<usize>() as u64, std::sync::atomic::Ordering::Relaxed);
            let mut fresh = Vec::with_capacity(slice.len());
            for (j, &i) in slice.iter().enumerate() {
                let v: Arc<[f32]> = Arc::from(enc.row(j));
                fresh.push((keys[i], v.clone()));
                out[i] = Some(v);
            }
            // each slice stored as it is done: a cancelled call keeps its work
            self.cache.put_many(&fresh);
        }
        Ok(out.into_iter().map(|v| v.expect("filled")).collect())
    }

    /// Refuses a context whose embedding would cost more than
    /// [`RequestLimits::max_encoder_tokens`](super::RequestLimits::max_encoder_tokens):
    /// the tokens of the texts not yet in the cache (a chunk's embedded text
    /// carries its label and, for prose, its neighbour, so it can cost twice
    /// the context's own tokens), two specials per window of the encoder (a text longer than its window is
    /// encoded as several). A text has at most as many tokens as bytes, so
    /// the count is skipped when the bytes are within the limit.
    fn check_encoder_spend(&self, texts: &[&str], missing: &[usize]) -> Result<()> {
        use rayon::prelude::*;
        let limit = self.cfg.limits.max_encoder_tokens;
        let spend_of = crate::encoder::encoder_spend(self.encoder.max_tokens());
        let bytes: usize = missing.iter().map(|&i| spend_of(texts[i].len())).sum();
        if bytes <= limit {
            return Ok(());
        }
        let spend: usize =
            missing.par_iter().map(|&i| self.encoder.count_tokens(texts[i]).map(&spend_of)).sum::<Result<usize>>()?;
        if spend > limit {
            return Err(Error::invalid(
                "context",
                format!(
                    "embedding its {} chunks would spend {spend} encoder tokens, over the limit of {limit} per request",
                    missing.len()
                ),
            ));
        }
        Ok(())
    }

    /// Every chunk's tokens in `tokenizer` (the encoder's counts when `None`).
    pub(super) fn counting(&self, ctx: &PreparedContext, tokenizer: Option<BudgetTokenizer>) -> Result<Counting> {
        use rayon::prelude::*;
        Ok(match tokenizer {
            None => Counting { tokens: ctx.chunks.iter().map(|c| c.tokens).collect(), separator: 0, tokenizer: None },
            Some(t) => Counting {
                tokens: ctx.chunks.par_iter().map(|c| t.count(&c.text)).collect::<Result<Vec<usize>>>()?.into(),
                separator: t.count(CHUNK_SEPARATOR)?,
                tokenizer: Some(t),
            },
        })
    }

    /// The prepared form of the public fields, from the context cache when
    /// the same fields (names, kinds, contents) were seen before.
    pub(super) fn prepare(&self, fields: &[&Field], cancel: &Cancel) -> Result<Arc<PreparedContext>> {
        self.prepare_given(fields, &Given::new(), cancel)
    }

    /// [`Scd::prepare`], taking chunk vectors from `given` where it holds
    /// them (see [`Scd::embed_given`]).
    pub(super) fn prepare_given(
        &self,
        fields: &[&Field],
        given: &Given,
        cancel: &Cancel,
    ) -> Result<Arc<PreparedContext>> {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(self.encoder.model_id().as_bytes());
        h.update([u8::from(self.cfg.prepare.embed_neighbour)]);
        for f in fields {
            h.update((f.name.len() as u64).to_le_bytes());
            h.update(f.name.as_bytes());
            h.update([f.kind as u8]);
            h.update((f.content.len() as u64).to_le_bytes());
            h.update(f.content.as_bytes());
        }
        let key: [u8; 32] = h.finalize().into();
        if let Some(p) = self.prepared.get(&key) {
            self.cache.record_hits(p.chunks.len());
            return Ok(p);
        }
        cancel.check("chunk")?;
        let (chunks, cut_functions) = self.prepare_chunks(fields, given, cancel)?;
        cancel.check("index")?;
        // code: BM25 also sees camel-case identifiers split (`RandomState` → `random state`)
        let lexical: Vec<std::borrow::Cow<'_, str>> = chunks
            .iter()
            .map(|c| {
                if self.cfg.prepare.code_names && fields[c.field].kind == FieldKind::Code {
                    std::borrow::Cow::Owned(format!("{} {}", c.embed_text, camel_words(&c.text)))
                } else {
                    std::borrow::Cow::Borrowed(c.embed_text.as_str())
                }
            })
            .collect();
        let bm25 = Bm25::new(&lexical);
        drop(lexical);
        let vectors: Vec<&[f32]> = chunks.iter().map(|c| &*c.embedding).collect();
        let index = (chunks.len() >= self.cfg.prepare.hnsw_min_chunks)
            .then(|| HnswIndex::build(&vectors, self.cfg.prepare.hnsw));
        let (distinct, unique) = distinct_vectors(&vectors);
        let near_duplicates = self.near_duplicates(&vectors, &distinct, &unique, index.as_ref());
        let dim = self.encoder.dim();
        let bytes = 256
            + chunks
                .iter()
                .map(|c| 160 + c.text.len() * 3 + c.embed_text.len() + c.stub.len() + c.id.len() + dim * 4)
                .sum::<usize>()
            + near_duplicates.iter().map(|l| 24 + l.len() * 4).sum::<usize>()
            + distinct.len() * 4
            + fields.len() * 8
            + index.as_ref().map_or(0, |i| i.len() * (dim * 4 + 24 * 8 * 2));
        let last_lines = last_lines(&chunks, fields.len());
        let prepared = Arc::new(PreparedContext {
            last_lines,
            distinct,
            near_duplicates,
            chunks,
            field_names: fields.iter().map(|f| f.name.clone()).collect(),
            field_kinds: fields.iter().map(|f| f.kind).collect(),
            field_keys: fields
                .iter()
                .map(|f| {
                    matches!(f.kind, crate::context::FieldKind::Prose | crate::context::FieldKind::Markdown)
                        .then(|| mention_key(&f.name))
                })
                .collect(),
            bm25,
            index,
            key,
            bytes,
            cut_functions,
        });
        if self.cfg.prepare.prepared_cache_bytes > 0 {
            self.prepared.insert(key, prepared.clone());
        }
        Ok(prepared)
    }

    /// Near-duplicate pairs among the distinct embeddings (`unique`: the
    /// first chunk of each), found once per context: among each one's
    /// `near_duplicate_neighbours` nearest neighbours when there is an HNSW index, otherwise by
    /// [`dedup::near_duplicates`] (exact for small contexts, LSH above).
    pub(super) fn near_duplicates(
        &self,
        vectors: &[&[f32]],
        distinct: &[u32],
        unique: &[usize],
        index: Option<&HnswIndex>,
    ) -> Vec<Vec<u32>> {
        use rayon::prelude::*;
        let t = self.cfg.scoring.redundancy_cosine;
        match index {
            Some(idx) => (0..unique.len())
                .into_par_iter()
                .map(|u| {
                    let v = vectors[unique[u]];
                    let mut near: Vec<u32> = idx
                        .search(v, self.cfg.prepare.near_duplicate_neighbours)
                        .into_iter()
                        .map(|j| distinct[j])
                        .filter(|&d| d as usize != u && dot(v, vectors[unique[d as usize]]) >= t)
                        .collect();
                    near.sort_unstable();
                    near.dedup();
                    near
                })
                .collect(),
            None => dedup::near_duplicates(&unique.iter().map(|&i| vectors[i]).collect::<Vec<_>>(), t),
        }
    }

    /// The chunks of `fields`, embedded, and the lead of each cut function
    /// among them (see [`PreparedContext::cut_functions`]).
    pub(super) fn prepare_chunks(&self, fields: &[&Field], given: &Given, cancel: &Cancel) -> Result<PreparedChunks> {
        let mut out: Vec<Prepared> = Vec::new();
        // what each chunk is embedded as: its label and text, after the
        // previous chunk of its group when `embed_neighbour` is on
        let mut vector_texts = Vec::new();
        let mut cut_functions = HashMap::new();
        for (fi, f) in fields.iter().enumerate() {
            let raw = chunk_field(f, self.cfg.prepare.chunk);
            // cut functions exist only when the chunker cuts them (a chunk
            // split_long cut keeps its default treatment)
            let function_ends = match self.cfg.prepare.chunk.long_function_bytes {
                0 => HashMap::new(),
                _ => cut_function_ends(&raw),
            };
            let base = out.len();
            let mut places = super::layout::layout(&f.content, &raw).into_iter();
            for (n, c) in raw.into_iter().enumerate() {
                let place = places.next().expect("one place per chunk");
                let text = f.content[c.start..c.end].to_string();
                let wrap = (c.chunker == "json").then(|| crate::chunk::json::wrapping(&text)).flatten();
                let label = match &c.heading {
                    Some(h) if h != &f.name => format!("{} — {h}", f.name),
                    _ => f.name.clone(),
                };
                let names: Vec<String> = c.defines.iter().map(|d| identifier_words(d)).collect();
                // a cut function's signature stands for the function: it is
                // embedded with the whole function (up to the longest code
                // chunk, as the function uncut would be), so the function
                // scores as it would uncut while its pieces score on their own
                let embedded = match function_ends.get(&c.group) {
                    Some(&end) if c.lead && end > c.end => {
                        cut_functions.insert((fi, c.group), out.len());
                        let mut e = end.min(c.start + self.cfg.prepare.chunk.max_code_chunk_bytes).max(c.end);
                        while !f.content.is_char_boundary(e) {
                            e -= 1;
                        }
                        &f.content[c.start..e]
                    }
                    _ => text.as_str(),
                };
                let embed_text = if f.kind == FieldKind::Code && self.cfg.prepare.code_names && !names.is_empty() {
                    format!("{label} ({}): {embedded}", names.join(", "))
                } else if c.chunker.starts_with("markdown") && self.cfg.prepare.markdown_link_text {
                    use crate::chunk::markdown::link_text;
                    format!("{}: {}", link_text(&label), link_text(&text))
                } else {
                    format!("{label}: {embedded}")
                };
                match out.last() {
                    Some(prev) if self.cfg.prepare.embed_neighbour && prev.group == (fi, c.group) => {
                        vector_texts.push(format!("{label}: {} {text}", prev.text));
                    }
                    _ => vector_texts.push(embed_text.clone()),
                }
                out.push(Prepared {
                    field: fi,
                    id: format!("{}#{n}", f.name),
                    span: (c.start, c.end),
                    tokens: self.encoder.count_tokens(&text)?,
                    embed_text,
                    text,
                    group: (fi, c.group),
                    lead: c.lead,
                    rides: c.rides,
                    embedding: Arc::from(Vec::new()),
                    defines: c.defines.iter().map(|d| mention_key(d)).collect(),
                    lower: f.content[c.start..c.end].to_lowercase(),
                    stub: stub(&f.content[c.start..c.end], self.cfg.sessions.stub_words),
                    chunker: c.chunker,
                    lines: place.lines,
                    indent: place.indent,
                    prev: place.prev.map(|p| base + p),
                    next: place.next.map(|n| base + n),
                    gap: place.gap,
                    wrap,
                    containers: Vec::new(),
                    severity: if c.chunker == "log" { crate::chunk::severity(&f.content[c.start..c.end]) } else { 0 },
                    section: c.heading.filter(|_| c.chunker.starts_with("markdown") || c.chunker == "json"),
                });
            }
            json_containers(&mut out[base..], base);
        }
        let total: usize = out.iter().map(|p| p.tokens).sum();
        if total > self.cfg.limits.max_context_tokens {
            return Err(Error::invalid(
                "context",
                format!(
                    "{total} tokens of non-confidential content, over the limit {}",
                    self.cfg.limits.max_context_tokens
                ),
            ));
        }
        let texts: Vec<&str> = vector_texts.iter().map(String::as_str).collect();
        let vecs = self.embed_given(&texts, given, cancel)?;
        for (p, v) in out.iter_mut().zip(vecs) {
            p.embedding = v;
        }
        Ok((out, cut_functions))
    }

    /// The passage vectors of `texts`: from `given` (vectors a shared
    /// store's context blob holds, by embedding cache key) where it has one
    /// under the key of the text itself that is a finite unit vector of the
    /// encoder's dimension, the rest through the cache and the encoder. A
    /// given vector goes into no cache, memory or disk: the store is not
    /// trusted with what other contexts read, and an entry under a key no
    /// text of these fields derives is never looked at.
    pub(super) fn embed_given(&self, texts: &[&str], given: &Given, cancel: &Cancel) -> Result<Vec<Arc<[f32]>>> {
        if given.is_empty() {
            return self.embed_cached_with(texts, InputKind::Passage, cancel);
        }
        let (model, dim) = (self.encoder.model_id(), self.encoder.dim());
        let mut out: Vec<Option<Arc<[f32]>>> = texts
            .iter()
            .map(|t| {
                let v = given.get(&EmbeddingCache::key(model, 0, t))?;
                (v.len() == dim && is_unit_vector(v)).then(|| Arc::from(v.as_slice()))
            })
            .collect();
        let rest: Vec<usize> = (0..texts.len()).filter(|&i| out[i].is_none()).collect();
        if !rest.is_empty() {
            let refs: Vec<&str> = rest.iter().map(|&i| texts[i]).collect();
            for (&i, v) in rest.iter().zip(self.embed_cached_with(&refs, InputKind::Passage, cancel)?) {
                out[i] = Some(v);
            }
        }
        Ok(out.into_iter().map(|v| v.expect("filled")).collect())
    }
}

/// Chunk vectors by embedding cache key, from a shared store's context blob.
pub(super) type Given = HashMap<[u8; 32], Vec<f32>>;

/// Prepared chunks and the lead of each cut function, by group.
pub(super) type PreparedChunks = (Vec<Prepared>, HashMap<(usize, usize), usize>);

/// The end of each function the code chunker cut into a signature and body
/// pieces (a parsed group whose lead does not ride, as a container's
/// header does), by group.
fn cut_function_ends(raw: &[crate::chunk::RawChunk]) -> HashMap<usize, usize> {
    let mut ends = HashMap::new();
    let mut cut: HashSet<usize> = HashSet::new();
    for c in raw.iter().filter(|c| c.chunker.starts_with("tree-sitter")) {
        if c.lead && !c.rides {
            cut.insert(c.group);
        }
        let e = ends.entry(c.group).or_insert(c.end);
        *e = (*e).max(c.end);
    }
    ends.retain(|g, _| cut.contains(g));
    ends
}

/// An identifier as lower-case words: `parse_header`, `ParseHeader` and
/// `parseHTTPHeader` → `parse header`, `parse header`, `parse http header`.
pub(super) fn identifier_words(ident: &str) -> String {
    let mut out = String::with_capacity(ident.len() + 4);
    let chars: Vec<char> = ident.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_alphanumeric() {
            if !out.ends_with(' ') && !out.is_empty() {
                out.push(' ');
            }
            continue;
        }
        let prev = i.checked_sub(1).map(|j| chars[j]);
        let next = chars.get(i + 1);
        let boundary = c.is_uppercase()
            && prev.is_some_and(|p| {
                p.is_lowercase() || p.is_numeric() || p.is_uppercase() && next.is_some_and(|n| n.is_lowercase())
            });
        if boundary && !out.ends_with(' ') {
            out.push(' ');
        }
        out.extend(c.to_lowercase());
    }
    out.trim().to_string()
}

/// The camel-case identifiers of `text` split into words (`RandomState
/// getHeader` → `random state get header`); identifiers without inner
/// capitals are left to BM25's own splitting.
fn camel_words(text: &str) -> String {
    let mut out = String::new();
    for word in text.split(|c: char| !c.is_alphanumeric()) {
        let humps = word.chars().skip(1).any(char::is_uppercase) && word.chars().any(char::is_lowercase);
        if humps {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(&identifier_words(word));
        }
    }
    out
}

/// Per field, its last line (1-based): a field whose last line is 1 is
/// one line, and its pieces' headers name no lines. Computed once, when
/// the context is prepared ([`PreparedContext::last_lines`]).
fn last_lines(chunks: &[Prepared], fields: usize) -> Vec<usize> {
    let mut last = vec![0; fields];
    for c in chunks {
        last[c.field] = last[c.field].max(c.lines.1);
    }
    last
}

#[cfg(test)]
mod code_name_tests {
    use super::*;

    #[test]
    fn identifiers_split_into_words() {
        assert_eq!(identifier_words("parse_header"), "parse header");
        assert_eq!(identifier_words("ParseHeader"), "parse header");
        assert_eq!(identifier_words("parseHTTPHeader"), "parse http header");
        assert_eq!(identifier_words("with_seed2"), "with seed2");
        assert_eq!(camel_words("let s = RandomState::new(); x.get_mut(); getHeader()"), "random state get header");
    }

    #[test]
    fn embed_slices_are_bounded_in_texts_and_bytes() {
        let items: Vec<usize> = (0..600).collect();
        let runs = slices(&items, |_| 10);
        assert_eq!(runs.iter().map(|r| r.len()).collect::<Vec<_>>(), [256, 256, 88]);
        // 40 KiB each: one per run past the byte bound, in order, none lost
        let runs = slices(&items[..5], |_| 40 << 10);
        assert_eq!(runs, [&[0][..], &[1], &[2], &[3], &[4]]);
        let big = slices(&[7, 8, 9], |i| if i == 8 { 1 << 20 } else { 100 });
        assert_eq!(big, [&[7][..], &[8], &[9]]);
        assert!(slices(&[], |_| 1).is_empty());
    }
}
