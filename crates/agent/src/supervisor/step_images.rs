//! Images a running attempt's steps ask for (Pyxis' `srun
//! --container-image`, on the attempt's endpoint): pinned by the server
//! for the attempt, pulled into the node's cache without a word to the
//! server's timeline, and shown to the attempt's user as a view
//! ([`crate::views`]) held until the attempt ends.

use super::*;

/// A mount of the GPUs' CDI edits: host path, path inside, read-only.
type GpuMount = (String, String, bool);

/// An image shown to an attempt's steps.
pub(super) struct StepView {
    digest: String,
    at: PathBuf,
    shown: serde_json::Value,
    _lease: ebb_image::Lease,
}

impl Processes {
    /// The server this agent reports to: step images are pinned there.
    pub(crate) fn reach_server(&self, client: Arc<crate::client::Client>) {
        let _ = self.server.set(client);
    }

    /// Shows the image `reference` to attempt `a`, run as `who`: what a
    /// step's container needs of it (`slurm/pyxis` in the CLI). Err: the
    /// status to answer and why.
    pub(crate) async fn show_step_image(
        self: &Arc<Self>,
        a: AttemptRef,
        (who, gpus): (&Identity, &[u8]),
        reference: String,
    ) -> Result<serde_json::Value, (u16, String)> {
        let refused = |why: String| (422, format!("image {reference}: {why}"));
        if let Err(why) = &self.images {
            return Err(refused(format!("this node runs no images: {why}")));
        }
        if !self.me.is_root() {
            return Err(refused(
                "this node's agent is not root, and only root may show a job an image".into(),
            ));
        }
        let server =
            self.server.get().ok_or_else(|| (503, "the agent has not reached its server yet".into()))?;
        if !self.running.lock().expect("running").contains_key(&a) {
            return Err((404, "the attempt has ended".into()));
        }
        // One at a time for the attempt: two steps naming one image share
        // its view. Another attempt's slow pull holds up none of its.
        let turn = self.showing.lock().expect("showing").entry(a).or_default().clone();
        let _one = turn.lock().await;
        let asked =
            ebb_api::StepImage { node: self.config.node.clone(), attempt: a, reference: reference.clone() };
        let image = server.step_image(&asked).await.map_err(|e| match e {
            // The server's reason, without its status ("422 ...: why").
            crate::client::CallError::Refused(why) => {
                let said = why
                    .split_once(": ")
                    .filter(|(status, _)| status.starts_with(|c: char| c.is_ascii_digit()));
                (422, said.map_or(why.clone(), |(_, reason)| reason.to_string()))
            }
            other => (503, other.to_string()),
        })?;
        let shown = self
            .step_views
            .lock()
            .expect("step views")
            .get(&a)
            .and_then(|views| views.iter().find(|v| v.digest == image.digest).map(|v| v.shown.clone()));
        if let Some(shown) = shown {
            return Ok(shown);
        }
        let lease = self.pull(a, &image, false).await.map_err(|e| (422, e.to_string()))?;
        let dir = crate::views::root(&self.config.data_dir).join(format!("{}-{}", a.job, a.attempt));
        let at = dir.join(image.digest.trim_start_matches("sha256:"));
        let (source, target, owner) = (lease.rootfs.clone(), at.clone(), who.clone());
        let mounted = crate::blocking(move || -> Result<(), String> {
            // The views' root is the agent's, open to pass through; each
            // attempt's directory the agent's too, which the job's group
            // alone may pass through: nothing in it is the job's to
            // replace (a link where a view is mounted would put the image
            // over the node's own files).
            let parent = target.parent().expect("a view has a directory");
            let root = parent.parent().expect("views have a root");
            dirs::own_dir(root, 0o711, None).map_err(|e| e.to_string())?;
            dirs::own_dir(parent, 0o710, None).map_err(|e| e.to_string())?;
            std::os::unix::fs::chown(parent, None, Some(owner.gid.as_raw()))
                .map_err(|e| format!("cannot give {} to the job's group: {e}", parent.display()))?;
            std::fs::create_dir_all(&target).map_err(|e| format!("cannot make {}: {e}", target.display()))?;
            crate::views::mount(&source, &target, owner.uid.as_raw(), owner.gid.as_raw())
                .map_err(|e| format!("cannot show the image to the job: {e}"))
        })
        .await;
        mounted.map_err(|why| (500, why))?;
        let (gpu_mounts, gpu_env) = self.gpu_edits(gpus).map_err(|why| (500, why))?;
        let shown = serde_json::json!({
            "reference": image.reference,
            "digest": image.digest,
            "rootfs": at,
            "env": lease.config.env,
            "working_dir": lease.config.working_dir,
            "entrypoint": lease.config.entrypoint,
            "gpu_mounts": gpu_mounts,
            "gpu_env": gpu_env,
        });
        tracing::info!(job = %a.job, attempt = %a.attempt, image = %image.digest, "image shown to a step");
        let view =
            StepView { digest: image.digest.clone(), at: at.clone(), shown: shown.clone(), _lease: lease };
        let live = self.running.lock().expect("running").contains_key(&a);
        if !live {
            // The attempt ended meanwhile: nothing keeps its view.
            self.showing.lock().expect("showing").remove(&a);
            crate::blocking(move || crate::views::remove(&dir)).await;
            return Err((404, "the attempt has ended".into()));
        }
        self.step_views.lock().expect("step views").entry(a).or_default().push(view);
        Ok(shown)
    }

    /// What the node's CDI spec adds to a container for `gpus`: its
    /// mounts (host path, path inside, read-only) and variables. A step's
    /// container has the node's `/dev`, whose GPUs other than the
    /// attempt's its device program refuses; its hooks are not run (they
    /// need the node's root).
    fn gpu_edits(&self, gpus: &[u8]) -> Result<(Vec<GpuMount>, Vec<String>), String> {
        let (Some(path), false) = (&self.config.cdi_spec, gpus.is_empty()) else {
            return Ok((Vec::new(), Vec::new()));
        };
        let text = std::fs::read(path).map_err(|e| format!("the CDI spec {}: {e}", path.display()))?;
        let spec: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| format!("the CDI spec {}: {e}", path.display()))?;
        let names: Vec<String> = gpus.iter().map(u8::to_string).collect();
        let edits = crate::container::cdi_edits(&spec, &names)
            .map_err(|e| format!("the CDI spec {}: {e}", path.display()))?;
        let mounts = edits
            .mounts
            .into_iter()
            .map(|m| {
                let read_only = m.options.iter().any(|o| o == "ro");
                (m.host_path, m.container_path, read_only)
            })
            .collect();
        Ok((mounts, edits.env))
    }

    /// After attempt `a` has ended: its steps' views go, and the images
    /// they held are let go.
    pub(super) async fn forget_step_images(&self, a: AttemptRef) {
        self.showing.lock().expect("showing").remove(&a);
        let Some(views) = self.step_views.lock().expect("step views").remove(&a) else { return };
        let dir = views.first().and_then(|v| v.at.parent().map(Path::to_path_buf));
        crate::blocking(move || {
            if let Some(dir) = dir {
                crate::views::remove(&dir);
            }
            drop(views);
        })
        .await;
    }
}
