//! Building Rows results: cells are written straight into one body buffer.

use bytes::{BufMut, Bytes, BytesMut};
use sluice_protocol::{ResultColumns, Rows, RowsMetadata};

/// Accumulates encoded rows (`[bytes]` cells) for a Rows result.
#[derive(Debug)]
pub(crate) struct RowsBuilder {
    body: BytesMut,
    columns: usize,
    rows: u32,
    in_row: usize,
}

impl RowsBuilder {
    /// A builder for rows of `columns` cells.
    pub fn new(columns: usize) -> Self {
        RowsBuilder {
            body: BytesMut::with_capacity(256),
            columns,
            rows: 0,
            in_row: 0,
        }
    }

    /// Appends one cell (None = null) to the current row.
    pub fn cell(&mut self, v: Option<&[u8]>) {
        match v {
            Some(b) => {
                self.body.put_i32(b.len() as i32);
                self.body.put_slice(b);
            }
            None => self.body.put_i32(-1),
        }
        self.in_row += 1;
        if self.in_row == self.columns {
            self.in_row = 0;
            self.rows += 1;
        }
    }

    /// Number of complete rows.
    pub fn len(&self) -> usize {
        self.rows as usize
    }

    /// Bytes of encoded rows so far.
    pub fn body_bytes(&self) -> usize {
        self.body.len()
    }

    /// Finishes the result. `columns` are the prepared statement's (shared, not copied);
    /// with `no_metadata` they are kept but not sent.
    pub fn finish(
        self,
        columns: ResultColumns,
        paging_state: Option<Bytes>,
        no_metadata: bool,
    ) -> Rows {
        Rows {
            metadata: RowsMetadata {
                columns,
                column_count: self.columns,
                paging_state,
                no_metadata,
            },
            row_count: self.rows,
            body: self.body.freeze(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_length_prefixed_and_rows_counted() {
        let mut b = RowsBuilder::new(2);
        b.cell(Some(b"ab"));
        b.cell(None);
        b.cell(Some(b""));
        assert_eq!(b.len(), 1);
        b.cell(Some(b"c"));
        let rows = b.finish(Vec::new().into(), None, true);
        assert_eq!(rows.row_count, 2);
        assert_eq!(rows.metadata.column_count, 2);
        assert_eq!(
            &rows.body[..],
            &[0, 0, 0, 2, b'a', b'b', 255, 255, 255, 255, 0, 0, 0, 0, 0, 0, 0, 1, b'c'][..]
        );
    }
}
