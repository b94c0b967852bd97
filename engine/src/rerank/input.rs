//! A cross-encoder's input, assembled exactly as the model was trained:
//! `[CLS] query [SEP] passage [SEP]`, the query cut to `query_max_tokens`,
//! the passage to what is left of `max_tokens`; token types 0 for
//! `[CLS] query [SEP]` and 1 for `passage [SEP]`; rows padded with zeros
//! (id, type and mask) to the batch's longest.

/// One pair's ids and token types (mask 1 on each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairInput {
    /// Token ids.
    pub ids: Vec<i64>,
    /// Token types: 0 for the query's part, 1 for the passage's.
    pub types: Vec<i64>,
}

/// The model's special tokens and limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// `[CLS]`'s id.
    pub cls: i64,
    /// `[SEP]`'s id.
    pub sep: i64,
    /// Longest input, specials included.
    pub max_tokens: usize,
    /// The query's tokens at most.
    pub query_max_tokens: usize,
}

impl Frame {
    /// `query` and `passage` (ids without special tokens) as one input:
    /// the query cut to `query_max_tokens`, the passage to `max_tokens - 3 -
    /// len(query)`.
    pub fn assemble(&self, query: &[u32], passage: &[u32]) -> PairInput {
        let q = &query[..query.len().min(self.query_max_tokens)];
        let room = self.max_tokens.saturating_sub(3 + q.len());
        let p = &passage[..passage.len().min(room)];
        let mut ids = Vec::with_capacity(q.len() + p.len() + 3);
        ids.push(self.cls);
        ids.extend(q.iter().map(|&t| i64::from(t)));
        ids.push(self.sep);
        let first = ids.len();
        ids.extend(p.iter().map(|&t| i64::from(t)));
        ids.push(self.sep);
        let mut types = vec![0i64; first];
        types.resize(ids.len(), 1);
        PairInput { ids, types }
    }
}

/// Rows padded to the longest: `(rows, len, ids, mask, types)`, row-major.
pub type Padded = (usize, usize, Vec<i64>, Vec<i64>, Vec<i64>);

/// `rows` padded with zeros (id 0, type 0, mask 0) to the longest.
pub fn pad(rows: &[&PairInput]) -> Padded {
    let len = rows.iter().map(|r| r.ids.len()).max().unwrap_or(0);
    let n = rows.len();
    let (mut ids, mut mask, mut types) = (vec![0i64; n * len], vec![0i64; n * len], vec![0i64; n * len]);
    for (r, row) in rows.iter().enumerate() {
        let at = r * len;
        ids[at..at + row.ids.len()].copy_from_slice(&row.ids);
        types[at..at + row.types.len()].copy_from_slice(&row.types);
        mask[at..at + row.ids.len()].fill(1);
    }
    (n, len, ids, mask, types)
}

/// Batches of at most `max_rows` inputs, shortest first (less padding):
/// each batch the indices of its inputs.
pub fn batches(lens: &[usize], max_rows: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by_key(|&i| (lens[i], i));
    order.chunks(max_rows.max(1)).map(<[usize]>::to_vec).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRAME: Frame = Frame { cls: 101, sep: 102, max_tokens: 16, query_max_tokens: 5 };

    #[test]
    fn a_short_pair_is_cls_query_sep_passage_sep_with_its_types() {
        let x = FRAME.assemble(&[7, 8], &[20, 21, 22]);
        assert_eq!(x.ids, vec![101, 7, 8, 102, 20, 21, 22, 102]);
        assert_eq!(x.types, vec![0, 0, 0, 0, 1, 1, 1, 1]);
    }

    #[test]
    fn a_long_query_and_a_long_passage_are_cut_to_their_limits() {
        let query: Vec<u32> = (1..=9).collect();
        let passage: Vec<u32> = (200..260).collect();
        let x = FRAME.assemble(&query, &passage);
        // the query keeps its first 5; the passage its first 16 - 3 - 5 = 8
        assert_eq!(x.ids.len(), 16);
        assert_eq!(&x.ids[..7], &[101, 1, 2, 3, 4, 5, 102]);
        assert_eq!(&x.ids[7..15], &[200, 201, 202, 203, 204, 205, 206, 207]);
        assert_eq!(x.ids[15], 102);
        assert_eq!(x.types, [vec![0; 7], vec![1; 9]].concat());
        // a short query leaves the passage more room
        let x = FRAME.assemble(&[1], &passage);
        assert_eq!(x.ids.len(), 16);
        assert_eq!(x.ids[3..15].to_vec(), (200..212).collect::<Vec<i64>>());
        // an empty passage still ends with [SEP]
        assert_eq!(FRAME.assemble(&[1], &[]).ids, vec![101, 1, 102, 102]);
    }

    #[test]
    fn rows_are_padded_with_zeros_and_masked() {
        let (a, b) = (FRAME.assemble(&[7], &[20, 21]), FRAME.assemble(&[7], &[20]));
        let (n, len, ids, mask, types) = pad(&[&a, &b]);
        assert_eq!((n, len), (2, 6));
        assert_eq!(ids, vec![101, 7, 102, 20, 21, 102, 101, 7, 102, 20, 102, 0]);
        assert_eq!(mask, vec![1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]);
        assert_eq!(types, vec![0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0]);
    }

    #[test]
    fn batches_group_by_length_under_the_row_cap() {
        let lens = [9, 3, 7, 3, 1];
        assert_eq!(batches(&lens, 2), vec![vec![4, 1], vec![3, 2], vec![0]]);
        assert_eq!(batches(&lens, 16).len(), 1);
        assert!(batches(&[], 16).is_empty());
    }
}
