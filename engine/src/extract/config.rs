//! The extractor's tuning and limits, nested by concern: [`PrepareConfig`]
//! (how a context is chunked, embedded, cached and indexed), [`ScoringConfig`]
//! (how chunks are scored and packed), [`RequestLimits`] (what one request
//! may ask for) and [`SessionConfig`] (sessions and adaptive requests).

use std::time::Duration;

use crate::chunk::ChunkConfig;
use crate::context::ContextLimits;
use crate::index::HnswParams;

/// How chunks are scored for packing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Scorer {
    /// The hand-weighted sum: `dense_z + lexical_weight·lexical_z +
    /// group_lift + link_lift (+ hop_lift)`.
    Hand,
    /// The same parts with the weights shipped with the engine
    /// ([`super::LearnedScorer::shipped`]), fitted on packed recall and
    /// chosen by leave-one-set-out (`models/fit_scorer.py`); the second hop
    /// keeps `second_hop_weight`. The link rules (`common_name_chunks`,
    /// `sibling_weight`) apply to both scorers.
    #[default]
    Learned,
}

/// The most lines `scd serve --code-context-lines` (and the tune key
/// `code_context_lines`) takes ([`ScoringConfig::code_context_lines`]).
pub const MAX_CODE_CONTEXT_LINES: usize = 8;

/// Tuning and limits of the extractor, nested by concern.
#[derive(Debug, Clone, Default)]
pub struct ScdConfig {
    /// How a context is prepared: chunking, embedding caches, neighbours, the
    /// HNSW index and its near-duplicate search.
    pub prepare: PrepareConfig,
    /// How chunks are scored and packed: the scorer, its weights, links, the
    /// second hop, group closure and redundancy.
    pub scoring: ScoringConfig,
    /// Bounds on one request, checked before the work they bound: budget,
    /// context, task and embedding.
    pub limits: RequestLimits,
    /// Sessions and adaptive requests: lifetime, counts, bytes, follow-up size,
    /// the confidence threshold and stubs.
    pub sessions: SessionConfig,
}

/// How a context is prepared: chunking, embedding caches, neighbours, the
/// HNSW index and its near-duplicate search.
#[derive(Debug, Clone)]
pub struct PrepareConfig {
    /// How fields are chunked.
    pub chunk: ChunkConfig,
    /// Code chunks are embedded and indexed with the names they define
    /// split into words (`parse_header`, `ParseHeader` → `parse header`)
    /// beside the file path and owner, and BM25 also sees their
    /// camel-case identifiers split (off: the code scoring before #13).
    pub code_names: bool,
    /// Embed each chunk after the previous chunk of its group (a sentence
    /// with the one before it in its paragraph), so a sentence that says
    /// "he" or "the film" is embedded with what it refers to.
    pub embed_neighbour: bool,
    /// A markdown chunk (and its section's name) is embedded as it reads:
    /// a link as its text, without its target, and without HTML anchor
    /// tags ([`crate::chunk::markdown::link_text`]); BM25 and the sent
    /// text still have them. Chosen by 5-fold cross-validation on the 40
    /// docs dev cases (BENCHMARKS.md).
    pub markdown_link_text: bool,
    /// Embedding cache bound in bytes.
    pub cache_bytes: usize,
    /// The persistent embedding cache's file ([`crate::cache::DiskTier`]),
    /// shared by every process that names it; `None`: memory only.
    pub embedding_store: Option<std::path::PathBuf>,
    /// Bytes the persistent cache holds at most.
    pub embedding_store_bytes: u64,
    /// Bytes of prepared contexts (chunks, embeddings, BM25, HNSW) kept for reuse.
    pub prepared_cache_bytes: usize,
    /// Nearest neighbours (count) searched per distinct chunk for
    /// near-duplicates when the context has an HNSW index.
    pub near_duplicate_neighbours: usize,
    /// Contexts with at least this many chunks get an HNSW index; dense
    /// scores are then computed exactly for its candidates only. Building
    /// the index is not cancellable and costs far more than it saves inside
    /// one request (measured: 90–140 s at 44k–61k chunks on 2 cores, warm
    /// selection no faster), so the default keeps it for very large
    /// contexts that the caller means to query many times.
    pub hnsw_min_chunks: usize,
    /// Candidates taken from HNSW per query.
    pub hnsw_candidates: usize,
    /// Chunks that are not HNSW candidates score this much (cosine units)
    /// below the lowest candidate, so they rank after every candidate.
    pub hnsw_floor_margin: f32,
    /// HNSW parameters.
    pub hnsw: HnswParams,
}

impl Default for PrepareConfig {
    fn default() -> Self {
        Self {
            chunk: ChunkConfig::default(),
            code_names: true,
            embed_neighbour: false,
            markdown_link_text: true,
            cache_bytes: 256 << 20,
            embedding_store: None,
            embedding_store_bytes: 1 << 30,
            prepared_cache_bytes: 512 << 20,
            near_duplicate_neighbours: 16,
            hnsw_min_chunks: 200_000,
            hnsw_candidates: 1024,
            hnsw_floor_margin: 0.05,
            hnsw: HnswParams::default(),
        }
    }
}

/// How chunks are scored and packed: the scorer, its weights, links, the
/// second hop, group closure and redundancy.
#[derive(Debug, Clone)]
pub struct ScoringConfig {
    /// How chunks are scored for packing.
    pub scorer: Scorer,
    /// Weight of the lexical (BM25) z-score beside the dense one.
    pub lexical_weight: f32,
    /// Weight of a field's best chunk score added to each of its chunks.
    pub field_weight: f32,
    /// Bonus for chunks of a field that the task or a top chunk names.
    pub link_weight: f32,
    /// Bonus for a method of a type that a top chunk defines (code: a
    /// member of `impl Foo` when `struct Foo` or another `impl Foo` header
    /// scores among the top chunks); 0 turns it off.
    pub owner_link_weight: f32,
    /// Top chunks whose mentions create links.
    pub link_sources: usize,
    /// A defined name that is a plain word (letters only: `left`, `both`)
    /// links only when at most this many chunks of its field mention it: a
    /// word the whole file uses is no sign that the task means that
    /// definition (0: every defined name links). Chosen on the code set.
    pub common_name_chunks: usize,
    /// Lift of a code chunk over its sibling, a definition whose name
    /// differs from its own in one word (`timestamp_millis`,
    /// `timestamp_seconds`), when the task names its differing word and not
    /// the sibling's (0: off). Added after scoring, in the score's units.
    pub sibling_weight: f32,
    /// Lift of a log chunk that reports an error (a line with `ERROR`,
    /// `FATAL`, `panic`, `Traceback`, `FAILED`...; a warning gets 0.4 of
    /// it): what an on-call reader looks at first. Shown in `group_lift`
    /// (the lift a chunk has for what its group is). 0 turns it off.
    pub severity_weight: f32,
    /// Further lift, beside `severity_weight`'s, of a log chunk holding a
    /// raised exception's line (`AssertionError: …`,
    /// `java.io.IOException: …`): the error's name and message, where a
    /// traceback of frames ends. Applied only while `severity_weight` is
    /// on. Chosen by 5-fold cross-validation on the 29 log cases
    /// (BENCHMARKS.md).
    pub exception_weight: f32,
    /// Extra weight of the lexical (BM25) z-score for chunks of log and
    /// chat fields, whose lines carry the words a reader greps for: added
    /// after scoring (either scorer), shown in `group_lift` (what the
    /// chunk's kind adds). 0 turns it off.
    pub line_lexical_weight: f32,
    /// Lift of a chunk whose lexical (BM25) z-score stands far out of its
    /// context's: `lexical_excess_weight · (lexical_z − lexical_excess_from)`
    /// above the threshold, nothing below. The words of the task that a
    /// `grep` would find, when few chunks hold them (a section headed by
    /// the product the task names), count for more than the linear
    /// weight gives them. Added after scoring (either scorer), shown in
    /// `group_lift`. 0 turns it off. 0.3 from 4 was chosen on the 184 agent
    /// cases by a grid and two cross-validations; on the Wikipedia dev
    /// halves it fires in some MuSiQue contexts but changes no selection
    /// (BENCHMARKS.md).
    pub lexical_excess_weight: f32,
    /// The lexical z-score above which [`Self::lexical_excess_weight`]
    /// lifts a chunk.
    pub lexical_excess_from: f32,
    /// Weight of a second hop (0 turns it off): the task is embedded again
    /// together with the texts of its best chunks from `second_hop_sources`
    /// different groups (the bridge facts of a multi-hop question), and each
    /// chunk gains this times its dense z-score against that query. Prose
    /// fields only (documents; a bridge entity links paragraphs, not
    /// functions). Chosen by `scd-dev tune` (BENCHMARKS.md).
    pub second_hop_weight: f32,
    /// Chunks (count, each from a different group) whose text joins the
    /// task in the second hop's query.
    pub second_hop_sources: usize,
    /// Tokens of the second hop's query (the task, then its bridge chunks'
    /// text), in the encoder's tokenizer: the chunks' text is cut at a word
    /// boundary past it, so a hop costs at most one short embedding however
    /// long the best chunk is. The task is never cut; when it alone fills the
    /// cap there is no hop.
    pub second_hop_max_tokens: usize,
    /// Packing takes the rest of a chunk's group (a paragraph's other
    /// sentences) with it when the whole group has at most this many tokens
    /// and all of it fits (0: only the group's lead comes along). Prose
    /// fields only: a paragraph comes whole, but a method does not bring its
    /// whole `impl`. Chosen by `scd-dev tune`. A markdown section has its
    /// own limit, `section_closure_tokens`.
    pub group_closure_tokens: usize,
    /// A second limit on the same closure, as a share of the budget: the
    /// rest of a paragraph comes along only when the whole paragraph costs
    /// at most this share of the budget, so one paragraph's other sentences
    /// do not take the room of another paragraph's best one when the budget
    /// holds few paragraphs (1 or more: no limit beyond
    /// `group_closure_tokens`; NaN and below 0 act as 0). Compress only
    /// (a continued session's too): a RequestContext follow-up asks for its
    /// answer's paragraph, and limited by its budget's share it lost
    /// MuSiQue's follow-ups (BENCHMARKS.md).
    /// Chosen by 5-fold cross-validation on the HotpotQA, 2Wiki and MuSiQue
    /// train samples (BENCHMARKS.md).
    pub group_closure_share: f32,
    /// As `group_closure_tokens`, for a markdown section (a heading and
    /// what follows it up to the next heading; a long table or list item is
    /// a section of its own): once one of its chunks is sent, the rest of a
    /// section of at most this many tokens comes too when all of it fits,
    /// so a how-to reads from its heading to its last step (0: only the
    /// heading comes along). Chosen by 5-fold cross-validation on the 40
    /// docs dev cases (BENCHMARKS.md).
    pub section_closure_tokens: usize,
    /// As `group_closure_tokens`, for a long function cut into its signature
    /// and body pieces (`long_function_bytes`): once one piece is sent, the
    /// rest of a function of at most this many tokens comes too when all of
    /// it fits, so a function is trimmed only when the budget is short
    /// (0: only its signature and closing line come along). At the default
    /// `function_whole_share` (1) a cut function that fits the budget comes
    /// whole anyway; this matters at a lower share.
    pub function_closure_tokens: usize,
    /// A cut function's body pieces rank no higher than its signature,
    /// which is embedded with the whole function: the function is
    /// ranked as a whole and trimmed only when it does not fit (false: each
    /// piece at its own score).
    pub function_pieces_capped: bool,
    /// With `function_pieces_capped`, the k-th best piece of a cut function
    /// ranks at most k times this below its signature, so a function that
    /// does not fit is trimmed to its best pieces rather than sent piece by
    /// piece at its own rank.
    pub function_piece_step: f32,
    /// A cut function (`long_function_bytes`) of at most this share of the
    /// budget is sent whole or not at all, as an uncut one is (packing, the
    /// fit and the refill take or drop its chunks together): only a function
    /// too long for that share is trimmed to its signature and best pieces
    /// (0: every cut function may be trimmed). Like closure, the rest of a
    /// function comes whatever its chunks' own scores. Above 1, a function
    /// between the budget and that share of it is never sent, not even
    /// trimmed. 1 was chosen with functions cut at 4 KiB: as good as 0, 0.5
    /// and 0.75 or better on the multi-file code and code-search dev sets at
    /// every budget; 1.5 fell at 5× on the former (BENCHMARKS.md).
    pub function_whole_share: f32,
    /// A code piece carries up to this many lines that are not blank from
    /// before it and after it, as a diff hunk does, so the receiver sees
    /// where it sits and where a change would go (an import above a class,
    /// the item after a constant); two pieces whose lines would meet are
    /// sent as one. Packing counts them with the piece's header (0: none).
    /// At most [`MAX_CODE_CONTEXT_LINES`].
    pub code_context_lines: usize,
    /// Packing sends a JSON container cut across several chunks (an array's
    /// element, an object's member) whole once one of its chunks is sent,
    /// when the container has at most this many tokens and the rest of it
    /// fits the budget; of the containers holding the chunk, the largest
    /// such (0: never, the default: chosen by 5-fold cross-validation over
    /// 0, 200, 400 and 800 on the 40 JSON dev cases, BENCHMARKS.md). A
    /// container whose chunks are all sent is rendered as one subtree under
    /// its path either way.
    pub json_whole_tokens: usize,
    /// Packing takes log chunks by value for their tokens: in the order of
    /// their score less this times the natural log of what each costs over
    /// 64 tokens (one entry pays nothing), so a short error line is not
    /// passed over for a long run of noise that scored a little higher.
    /// Only log chunks: a docs section or a function is a unit whose length
    /// says nothing of its worth (docs, JSON and chat fell with it). 0 packs
    /// by score alone. The fit that makes the whole text fit drops the least
    /// valued first; reported scores and the threshold are unchanged. 1.5
    /// was chosen by 5-fold cross-validation over 0–3 on the 29 log cases
    /// (BENCHMARKS.md).
    pub log_size_weight: f32,
    /// A log or chat chunk that follows a higher-scored chunk of its kind
    /// in its field is packed at its score plus this share of the
    /// difference, 0 to 1. Logs and chats are streams: the line an error
    /// caused and a discussion's decision (`Shall I pencil in Thursday
    /// then?` `definitely`) come after what raised them and repeat few of
    /// the task's words. A chat chunk that is not its group's lead (an
    /// answer in a short chat cut by turns, which waits at its own score,
    /// or a later piece of a turn over 2 KiB) is not lifted. 0 packs by
    /// score alone (less `log_size_weight` for logs); reported scores and
    /// the threshold are unchanged (a follow-up's candidates are still
    /// those scoring 0 or more: the lift orders them, it lets none in). 0.3 was
    /// chosen by 5-fold cross-validation over 0–0.4 on the 49 log and chat
    /// cases (BENCHMARKS.md); other kinds are units whose order says
    /// nothing of this.
    pub follow_weight: f32,
    /// Multiplier of `link_weight` for a linked document's lead chunk and for
    /// a chunk defining a name that the task or a top chunk mentions
    /// (dimensionless; 1.0 treats them like any other linked chunk).
    pub lead_link_bonus: f32,
    /// Chunks this similar (cosine) to a selected one are skipped as
    /// redundant when they repeat its text (packing); one that differs (two
    /// functions apart by one word) is kept.
    pub redundancy_cosine: f32,
    /// A code chunk over `redundancy_cosine` to a sent one that differs
    /// from it waits in the packing queue at its score less this (score
    /// units, the z-scored sum; 0 to 10; 0 packs it at its score): what it
    /// adds is the difference, so a chunk worth a little less that repeats
    /// nothing sent goes first, and the near copy still comes when the
    /// budget holds both. The fit and the refill weigh it at that value
    /// too; the reported score and the threshold are unchanged. Only code:
    /// log lines and prose that differ this little carry other facts, and
    /// logs fell with it. 3: of 0, 3 and 5, most folds of code search and
    /// every fold of the agent cases chose it (BENCHMARKS.md).
    pub near_duplicate_penalty: f32,
    /// Weight of the second stage (0, the default, turns it off; 1 is what
    /// cross-validation on train-split questions chose, not yet the default:
    /// BENCHMARKS.md says why; nothing happens without a reranker): with a reranker
    /// ([`super::Scd::with_reranker`]), the `rerank_top` best chunks by the
    /// first stage's score are read with the task by the cross-encoder, its
    /// logits z-scored among them, and each gains this times its z-score
    /// (never falling below a chunk outside them). Either scorer.
    pub rerank_weight: f32,
    /// Chunks (count) the second stage rescores: the best by the first
    /// stage's final score.
    pub rerank_top: usize,
}

impl Default for ScoringConfig {
    fn default() -> Self {
        Self {
            scorer: Scorer::default(),
            lexical_weight: 0.3,
            field_weight: 0.5,
            link_weight: 2.0,
            owner_link_weight: 1.0,
            link_sources: 3,
            common_name_chunks: 3,
            sibling_weight: 1.0,
            severity_weight: 1.5,
            exception_weight: 1.0,
            line_lexical_weight: 0.0,
            lexical_excess_weight: 0.3,
            lexical_excess_from: 4.0,
            second_hop_weight: 0.5,
            second_hop_sources: 1,
            second_hop_max_tokens: 256,
            group_closure_tokens: 400,
            group_closure_share: 0.4,
            section_closure_tokens: 1200,
            function_closure_tokens: 1200,
            function_pieces_capped: true,
            function_piece_step: 0.01,
            function_whole_share: 1.0,
            code_context_lines: 1,
            log_size_weight: 1.5,
            follow_weight: 0.3,
            json_whole_tokens: 0,
            lead_link_bonus: 1.5,
            redundancy_cosine: 0.985,
            near_duplicate_penalty: 3.0,
            rerank_weight: 0.0,
            rerank_top: 24,
        }
    }
}

/// Bounds on one request, checked before the work they bound: budget,
/// context, task and embedding.
#[derive(Debug, Clone)]
pub struct RequestLimits {
    /// Largest budget a request may ask for.
    pub max_budget_tokens: usize,
    /// Limits on a context's size, checked before any work.
    pub context_limits: ContextLimits,
    /// Tokens of a context's non-confidential content, checked after
    /// counting and before embedding.
    pub max_context_tokens: usize,
    /// Encoder tokens one request may spend embedding its context (the
    /// chunks' embedded texts not yet cached, labels and neighbours
    /// included): the bound on its CPU, as the bytes and tokens above bound
    /// its size.
    pub max_encoder_tokens: usize,
    /// Bytes of a task (description, constraints and schema together).
    pub max_task_bytes: usize,
    /// Tokens of a task's embedded text.
    pub max_task_tokens: usize,
    /// Constraints on a task.
    pub max_constraints: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_budget_tokens: 1 << 20,
            context_limits: ContextLimits::default(),
            max_context_tokens: 1 << 20,
            max_encoder_tokens: 1 << 21,
            max_task_bytes: 64 << 10,
            max_task_tokens: 4096,
            max_constraints: 256,
        }
    }
}

/// Sessions and adaptive requests: lifetime, counts, bytes, follow-up size,
/// the confidence threshold and stubs.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Session lifetime since last use.
    pub session_ttl: Duration,
    /// Sessions held at once (least recently used evicted, never silently).
    pub max_sessions: usize,
    /// Bytes all sessions may hold together (each counts its whole context).
    pub session_bytes: usize,
    /// Chunks an adaptive request returns by relevance at most (count),
    /// beyond the ids it names.
    pub more_max_chunks: usize,
    /// Receiver confidence at or above which adaptive requests get nothing (θ_conf).
    pub confidence_threshold: f32,
    /// Cosine of the follow-up's question (with its reasoning, as it is
    /// scored) with a chunk's group (its best chunk: a paragraph's, a
    /// section's, a function's) below which the chunk is not sent unless
    /// named: the question is not about it. `None`: the encoder's own floor
    /// for the chunk's kind of field
    /// ([`crate::encoder::Encoder::relevance_floor`]; none for a model
    /// without one); `Some(f)`: `f` for every kind; `Some(-1.0)` turns it
    /// off, and so does a value outside [-1, 1] or NaN. Either way a
    /// follow-up with no candidate sends nothing, not the bridges between
    /// held pieces.
    pub more_min_relevance: Option<f32>,
    /// Words of a dropped chunk's stub in the manifest (count).
    pub stub_words: usize,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            session_ttl: Duration::from_secs(1800),
            max_sessions: 10_000,
            session_bytes: 1 << 30,
            more_max_chunks: 8,
            confidence_threshold: 0.7,
            more_min_relevance: None,
            stub_words: 8,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nested defaults are the values the flat `ScdConfig` had: a
    /// regrouping must not move a tuned constant.
    #[test]
    fn nested_defaults_keep_the_flat_values() {
        let c = ScdConfig::default();
        assert_eq!(c.prepare.cache_bytes, 256 << 20);
        assert_eq!(c.prepare.embedding_store, None);
        assert_eq!(c.prepare.embedding_store_bytes, 1 << 30);
        assert_eq!(c.prepare.prepared_cache_bytes, 512 << 20);
        assert!(c.prepare.code_names);
        assert!(!c.prepare.embed_neighbour);
        assert!(c.prepare.markdown_link_text);
        assert_eq!(c.prepare.near_duplicate_neighbours, 16);
        assert_eq!(c.prepare.hnsw_min_chunks, 200_000);
        assert_eq!(c.prepare.hnsw_candidates, 1024);
        assert_eq!(c.scoring.scorer, Scorer::Learned);
        assert_eq!(c.scoring.lexical_weight, 0.3);
        assert_eq!(c.scoring.field_weight, 0.5);
        assert_eq!(c.scoring.link_weight, 2.0);
        assert_eq!(c.scoring.link_sources, 3);
        assert_eq!(c.scoring.severity_weight, 1.5);
        assert_eq!(c.scoring.exception_weight, 1.0);
        assert_eq!(c.scoring.line_lexical_weight, 0.0);
        assert_eq!((c.scoring.lexical_excess_weight, c.scoring.lexical_excess_from), (0.3, 4.0));
        assert_eq!(c.scoring.second_hop_weight, 0.5);
        assert_eq!(c.scoring.second_hop_max_tokens, 256);
        assert_eq!(c.scoring.group_closure_tokens, 400);
        assert_eq!(c.scoring.group_closure_share, 0.4);
        assert_eq!(c.scoring.section_closure_tokens, 1200);
        assert_eq!(c.scoring.function_closure_tokens, 1200);
        assert!(c.scoring.function_pieces_capped);
        assert_eq!(c.scoring.function_piece_step, 0.01);
        assert_eq!(c.scoring.log_size_weight, 1.5);
        assert_eq!(c.scoring.follow_weight, 0.3);
        assert_eq!(c.scoring.near_duplicate_penalty, 3.0);
        assert_eq!(c.prepare.chunk.long_function_bytes, 8 << 10);
        assert_eq!(c.scoring.function_whole_share, 1.0);
        assert_eq!(c.scoring.code_context_lines, 1);
        assert_eq!(c.scoring.json_whole_tokens, 0);
        assert_eq!(c.scoring.lead_link_bonus, 1.5);
        assert_eq!(c.scoring.redundancy_cosine, 0.985);
        assert_eq!(c.scoring.rerank_weight, 0.0);
        assert_eq!(c.scoring.rerank_top, 24);
        assert_eq!(c.limits.max_budget_tokens, 1 << 20);
        assert_eq!(c.limits.max_context_tokens, 1 << 20);
        assert_eq!(c.limits.max_encoder_tokens, 1 << 21);
        assert_eq!(c.limits.max_task_bytes, 64 << 10);
        assert_eq!(c.limits.max_task_tokens, 4096);
        assert_eq!(c.limits.max_constraints, 256);
        assert_eq!(c.sessions.session_ttl, Duration::from_secs(1800));
        assert_eq!(c.sessions.max_sessions, 10_000);
        assert_eq!(c.sessions.session_bytes, 1 << 30);
        assert_eq!(c.sessions.more_max_chunks, 8);
        assert_eq!(c.sessions.confidence_threshold, 0.7);
        assert_eq!(c.sessions.more_min_relevance, None);
        assert_eq!(c.sessions.stub_words, 8);
    }
}
