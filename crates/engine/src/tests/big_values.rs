//! Big rows: a client page of big rows ends at `MAX_PAGE_BYTES` whatever its fetch size, and
//! every row still comes back, in order, across pages.

use super::*;
use crate::read::MAX_PAGE_BYTES;

const ROW_BYTES: usize = 200 << 10;
const ROWS: i32 = 24;

/// Creates `ks.blobs (pk, ck, v blob)` and writes `ROWS` rows of `ROW_BYTES` into partition 1.
async fn load_blobs(h: &mut H) {
    h.setup_kv().await;
    h.ok("CREATE TABLE ks.blobs (pk int, ck int, v blob, PRIMARY KEY (pk, ck))")
        .await;
    for ck in 0..ROWS {
        let blob = Value::Set(Bytes::from(vec![ck as u8; ROW_BYTES]));
        h.exec(
            "INSERT INTO ks.blobs (pk, ck, v) VALUES (1, ?, ?)",
            vec![int(ck), blob],
        )
        .await
        .unwrap();
    }
}

/// Pages through `q` at fetch size 5000; every page must stay within the byte bound.
async fn page_bounded(h: &mut H, q: &str) -> (Vec<i32>, usize) {
    let mut cks = Vec::new();
    let mut state: Option<Bytes> = None;
    let mut pages = 0;
    loop {
        let params = QueryParameters {
            page_size: Some(5000),
            paging_state: state.clone(),
            ..QueryParameters::default()
        };
        let r = match h.exec_params(q, params).await.unwrap() {
            ResultMessage::Rows(r) => r,
            other => panic!("{other:?}"),
        };
        pages += 1;
        assert!(
            r.body.len() <= MAX_PAGE_BYTES + ROW_BYTES + 64,
            "a page of {} bytes",
            r.body.len()
        );
        for row in cells(&r) {
            assert_eq!(row[1].as_ref().map(|v| v.len()), Some(ROW_BYTES));
            cks.push(cint(&row[0]));
        }
        state = r.metadata.paging_state.clone();
        if state.is_none() {
            return (cks, pages);
        }
        assert!(pages < 1000, "paging does not terminate");
    }
}

#[tokio::test]
async fn pages_of_big_rows_end_at_the_byte_bound_and_return_every_row() {
    let mut h = H::new();
    load_blobs(&mut h).await;
    let expected: Vec<i32> = (0..ROWS).collect();
    let least_pages = ROWS as usize * ROW_BYTES / (MAX_PAGE_BYTES + ROW_BYTES);

    let (cks, pages) = page_bounded(&mut h, "SELECT ck, v FROM ks.blobs WHERE pk = 1").await;
    assert_eq!(cks, expected);
    assert!(pages >= least_pages, "{pages} pages");

    let (cks, pages) = page_bounded(&mut h, "SELECT ck, v FROM ks.blobs").await;
    assert_eq!(cks, expected);
    assert!(pages >= least_pages, "{pages} pages");

    // An unpaged read is not cut into pages: it fits in one result or answers an error
    // (the bound is 1 MiB in tests), never a short result.
    let e = h
        .err("SELECT ck, v FROM ks.blobs WHERE pk = 1", vec![])
        .await;
    assert_eq!(e.code(), ErrorCode::Invalid, "{e:?}");
    assert!(e.message.contains("larger than a response frame"), "{e:?}");
    let few = h
        .select("SELECT ck, v FROM ks.blobs WHERE pk = 1 LIMIT 3", vec![])
        .await;
    assert_eq!(few.len(), 3);
}
