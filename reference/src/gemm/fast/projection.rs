//! What fast verification reports of a pass beyond its sampled elements: the random
//! projections of every row, whole and by chunks of columns, and the NaN/inf scan
//! ([`FastPass`]), part of the grouped GEMM's [`crate::gemm::CaseReport`] under
//! [`super::Verify::Fast`].

use serde::{Deserialize, Serialize};

use crate::gemm::case::Pass;
use crate::gemm::compare::GemmAt;
use crate::report::sci;

/// The row of a projection check that came closest to (or furthest past) its threshold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProjectionWorst {
    pub group: usize,
    /// Row of `out`/`dlhs` (global), or the `k` index of `drhs[group]`.
    pub row: usize,
    /// `max_v |Σ_j got_ij·x_j − p̂_i|` over the vectors.
    pub deviation: f64,
    pub threshold: f64,
}

/// The chunk of a row (see [`super::CHUNK`]) that came closest to (or furthest past) its
/// threshold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkWorst {
    pub group: usize,
    /// Row of `out`/`dlhs` (global), or the `k` index of `drhs[group]`.
    pub row: usize,
    /// The chunk's first column.
    pub col: usize,
    /// The chunk's columns (`CHUNK`, fewer for a row's last chunk).
    pub width: usize,
    /// `|Σ_{j in chunk} got_ij·x_j − p̂_ic|`.
    pub deviation: f64,
    pub threshold: f64,
}

/// What fast verification checked of one pass beyond the sampled elements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FastPass {
    pub pass: Pass,
    /// `±1` vectors each row was projected on.
    pub vectors: usize,
    /// Rows projected (every row of every expert; tail rows are checked element by element).
    pub rows: usize,
    /// Rows whose projection left its threshold (NaN included).
    pub failed_rows: usize,
    /// `max deviation / threshold` over the rows.
    pub max_ratio: f64,
    pub worst: Option<ProjectionWorst>,
    /// Columns per chunk of the chunked projections ([`super::CHUNK`]).
    #[serde(default)]
    pub chunk: usize,
    /// Chunks projected (every chunk of every row projected above).
    #[serde(default)]
    pub chunks: usize,
    /// Chunks whose projection left its threshold (NaN included).
    #[serde(default)]
    pub failed_chunks: usize,
    /// `max deviation / threshold` over the chunks.
    #[serde(default)]
    pub chunk_max_ratio: f64,
    #[serde(default)]
    pub chunk_worst: Option<ChunkWorst>,
    /// NaN or ±inf elements anywhere in the output (every element is read).
    pub non_finite: usize,
    pub first_non_finite: Option<GemmAt>,
}

impl FastPass {
    /// Adds the rows of `later` (the next blocks of the same pass): counts summed, the first
    /// non-finite element kept, the worst row replaced only by a strictly worse one (as
    /// inside a block).
    pub(super) fn absorb(&mut self, later: FastPass) {
        self.rows += later.rows;
        self.failed_rows += later.failed_rows;
        self.chunks += later.chunks;
        self.failed_chunks += later.failed_chunks;
        if later.chunk_worst.is_some()
            && (self.chunk_worst.is_none() || later.chunk_max_ratio > self.chunk_max_ratio)
        {
            self.chunk_max_ratio = later.chunk_max_ratio;
            self.chunk_worst = later.chunk_worst;
        }
        self.non_finite += later.non_finite;
        self.first_non_finite = self.first_non_finite.or(later.first_non_finite);
        if later.worst.is_some() && (self.worst.is_none() || later.max_ratio > self.max_ratio) {
            self.max_ratio = later.max_ratio;
            self.worst = later.worst;
        }
    }

    pub fn passed(&self) -> bool {
        self.failed_rows == 0 && self.failed_chunks == 0 && self.non_finite == 0
    }

    /// One line on its failure, `None` when it passed.
    pub fn failure(&self) -> Option<String> {
        if let Some(at) = &self.first_non_finite {
            return Some(format!(
                "{}: {} NaN/inf element(s), the first at {} row {} col {} (fast verification fails every one; where rounding to the output format may overflow, --verify full judges each infinity)",
                self.pass, self.non_finite, at.group, at.row, at.col
            ));
        }
        if let Some(w) = self.chunk_worst.as_ref().filter(|_| self.failed_chunks > 0) {
            return Some(format!(
                "{}: {} chunk(s) of {} columns fail their projection (an error above the chunk's summed bound; {} row(s) of {} fail their random projections); worst expert {} row {} cols {}..{}: deviation {}, threshold {}",
                self.pass, self.failed_chunks, self.chunk, self.failed_rows, self.rows, w.group, w.row, w.col, w.col + w.width, sci(w.deviation), sci(w.threshold)
            ));
        }
        let w = self.worst.as_ref().filter(|_| self.failed_rows > 0)?;
        Some(format!(
            "{}: {} row(s) of {} fail their random projections (the error is above the row's summed bound); worst expert {} row {}: deviation {}, threshold {}",
            self.pass, self.failed_rows, self.rows, w.group, w.row, sci(w.deviation), sci(w.threshold)
        ))
    }
}
