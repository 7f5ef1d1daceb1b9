//! The content store: blobs written, labelled and read by digest.

use super::*;

impl Client {
    /// Stores `data` in the content store, labelled, and returns its descriptor.
    pub fn write_blob(
        &self,
        media_type: &str,
        data: Vec<u8>,
        labels: HashMap<String, String>,
    ) -> Result<Descriptor> {
        let digest = format!(
            "sha256:{}",
            chalk_runtime::snapshot::hash::sha256_hex(&data)
        );
        let size = data.len() as i64;
        // In pieces: containerd takes gRPC messages of 16 MiB at most.
        const PIECE: usize = 4 << 20;
        let pieces: Vec<&[u8]> = if data.is_empty() {
            vec![&[][..]]
        } else {
            data.chunks(PIECE).collect()
        };
        let last = pieces.len() - 1;
        // A ref of this writer's own: containerd locks a ref while it is written, and two
        // chalkctls may store the same blob at once (the second commit finds it there).
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let write_ref = format!("chalkctl-{digest}-{}-{n}", std::process::id());
        let messages: Vec<WriteContentRequest> = pieces
            .into_iter()
            .enumerate()
            .map(|(i, piece)| WriteContentRequest {
                action: if i == last {
                    WriteAction::Commit as i32
                } else {
                    WriteAction::Write as i32
                },
                r#ref: write_ref.clone(),
                total: size,
                expected: digest.clone(),
                offset: (i * PIECE) as i64,
                data: piece.to_vec(),
                labels: if i == last {
                    labels.clone()
                } else {
                    HashMap::new()
                },
            })
            .collect();
        let mut client = ContentClient::new(self.channel.clone());
        let req = self.req(tokio_stream::iter(messages));
        let written = self.rt.block_on(async {
            let mut stream = client.write(req).await?.into_inner();
            while stream.message().await?.is_some() {}
            Ok::<(), Status>(())
        });
        match written {
            Ok(()) => {}
            Err(e) if e.code() == Code::AlreadyExists => {}
            Err(e) => return Err(describe(&format!("store {digest}"), e)),
        }
        Ok(Descriptor {
            media_type: media_type.to_string(),
            digest,
            size,
            annotations: HashMap::new(),
        })
    }

    /// Whether the content store holds blob `digest`.
    pub fn has_blob(&self, digest: &str) -> Result<bool> {
        let req = self.req(ContentInfoRequest {
            digest: digest.to_string(),
        });
        let found = self
            .rt
            .block_on(ContentClient::new(self.channel.clone()).info(req));
        exists(found, &format!("look up {digest}"))
    }

    /// Adds `labels` to blob `digest` (the others stay).
    pub fn label_blob(&self, digest: &str, labels: HashMap<String, String>) -> Result<()> {
        let paths = labels.keys().map(|k| format!("labels.{k}")).collect();
        let req = self.req(UpdateContentRequest {
            info: Some(ContentInfo {
                digest: digest.to_string(),
                labels,
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask { paths }),
        });
        self.rt
            .block_on(ContentClient::new(self.channel.clone()).update(req))
            .map(drop)
            .map_err(|e| describe(&format!("label {digest}"), e))
    }

    /// The whole of blob `digest`, checked against its digest: a snapshot is named by the
    /// digest of its index, and everything the index names is named by digest in turn.
    pub fn read_blob(&self, digest: &str) -> Result<Vec<u8>> {
        let data = self.read_range(digest, 0, 0)?;
        verify_digest(digest, &data)?;
        Ok(data)
    }

    /// `size` bytes of blob `digest` from `offset` (0: to the end); fewer at its end.
    pub fn read_range(&self, digest: &str, offset: u64, size: u64) -> Result<Vec<u8>> {
        let req = self.req(ReadContentRequest {
            digest: digest.to_string(),
            offset: offset as i64,
            size: size as i64,
        });
        let mut client = ContentClient::new(self.channel.clone());
        self.rt
            .block_on(async {
                let mut stream = client.read(req).await?.into_inner();
                let mut out = Vec::new();
                while let Some(chunk) = stream.message().await? {
                    out.extend_from_slice(&chunk.data);
                }
                Ok::<_, Status>(out)
            })
            .map_err(|e| describe(&format!("read {digest}"), e))
    }
}
