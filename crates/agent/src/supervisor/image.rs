//! A start in an image: its pull (given up when the attempt is, or past
//! the node's limits) and its container (`ebb container-shim`, in the
//! attempt's cgroup).

use super::*;

impl Processes {
    /// [`Processes::pull`], given up when a stop, a cancel or a drain
    /// comes for the attempt meanwhile ([`Supervisor::abandon`]): a pull
    /// holds its GPUs, and must end as a running attempt would.
    pub(super) async fn pull_unless_abandoned(
        &self,
        a: AttemptRef,
        image: &ebb_api::StartImage,
    ) -> Result<ebb_image::Lease, StartError> {
        let (abandon, mut abandoned) = watch::channel(None);
        self.pulling.lock().expect("pulling").insert(a, abandon);
        let pulled = tokio::select! {
            pulled = self.pull(a, image, true) => pulled.map_err(StartError::from),
            why = abandoned.wait_for(Option::is_some) => {
                Err(StartError::Abandoned(why.map(|w| w.clone().unwrap_or_default()).unwrap_or_default()))
            }
        };
        self.pulling.lock().expect("pulling").remove(&a);
        pulled
    }

    /// Holds the attempt's image, pulling it first where the node's cache
    /// lacks it; the pull's progress is reported as it goes (at most once
    /// a second), and its end in any case. A pull that takes longer than
    /// `--pull-timeout`, or downloads slower than `--pull-min-speed` over
    /// a window, is given up. Unless `report`, the server hears nothing of
    /// it (a running attempt's step's image).
    pub(super) async fn pull(
        &self,
        a: AttemptRef,
        image: &ebb_api::StartImage,
        report: bool,
    ) -> Result<ebb_image::Lease, ImageError> {
        let reference = || image.reference.clone();
        let cache = self
            .images
            .as_ref()
            .map_err(|cache| ImageError::NoCache { reference: reference(), cache: cache.clone() })?;
        let login = image
            .username
            .clone()
            .zip(image.password.clone())
            .map(|(username, password)| ebb_image::Login { username, password });
        let reporter = self.reporter.clone();
        let started = std::time::Instant::now();
        let mut last: Option<std::time::Instant> = None;
        let progress = move |p: ebb_image::Progress| {
            let due = last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) || p.done == p.total;
            if report && due {
                last = Some(std::time::Instant::now());
                reporter.send(AgentEvent::Pulling {
                    attempt: a,
                    done_bytes: p.done,
                    total_bytes: p.total,
                    at_ms: now_ms(),
                });
            }
        };
        let limits = self.config.images.pull;
        let downloaded = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = downloaded.clone();
        let progress = {
            let mut progress = progress;
            move |p: ebb_image::Progress| {
                // Done is the download's: an unpack after it is local work.
                let moving = if p.done >= p.total { u64::MAX } else { p.done };
                counted.store(moving, std::sync::atomic::Ordering::Relaxed);
                progress(p)
            }
        };
        let acquire = cache.acquire(&image.reference, &image.digest, login.as_ref(), progress);
        let lease = limits
            .watch(acquire, || downloaded.load(std::sync::atomic::Ordering::Relaxed))
            .await
            .map_err(|why| ImageError::GivenUp { reference: reference(), why })??;
        tracing::info!(
            job = %a.job,
            attempt = %a.attempt,
            image = image.digest,
            downloaded = lease.downloaded,
            "image ready"
        );
        if !report {
            return Ok(lease);
        }
        self.reporter.send(AgentEvent::Pulled {
            attempt: a,
            downloaded_bytes: lease.downloaded,
            duration_ms: started.elapsed().as_millis() as u64,
            at_ms: now_ms(),
        });
        Ok(lease)
    }

    /// Starts the attempt's container: its bundle, then the shim that runs
    /// it (as root, in the attempt's cgroup; the job inside runs as its
    /// user). Returns the shim and the file it says a failed start in.
    pub(super) fn spawn_container(
        &self,
        s: &StartAttempt,
        p: &Prepared,
        endpoint: &str,
        lease: &ebb_image::Lease,
    ) -> Result<(spawn::Child, Option<Shim>), StartError> {
        use crate::container;
        let image = s.image.as_ref().expect("an image");
        if !self.me.is_root() {
            return Err(ImageError::NeedsRoot(image.reference.clone()).into());
        }
        let mut env = self.job_env(s, p, endpoint);
        // The image's variables under the job's; its PATH over the node's
        // unless the job gave one.
        for pair in &lease.config.env {
            if let Some((k, v)) = pair.split_once('=') {
                if k == "PATH" && !s.env.contains_key("PATH") {
                    env.insert(k.to_string(), v.to_string());
                } else {
                    env.entry(k.to_string()).or_insert_with(|| v.to_string());
                }
            }
        }
        let gpus = match (&self.config.cdi_spec, s.gpus.is_empty()) {
            (Some(path), false) => {
                let path = || path.clone();
                let text =
                    std::fs::read(path()).map_err(|source| ImageError::CdiFile { path: path(), source })?;
                let spec: serde_json::Value = serde_json::from_slice(&text)
                    .map_err(|source| ImageError::CdiJson { path: path(), source })?;
                let names: Vec<String> = s.gpus.iter().map(u8::to_string).collect();
                let edits = container::cdi_edits(&spec, &names)
                    .map_err(|source| ImageError::Cdi { path: path(), source })?;
                // Inside, the container's GPUs are its only ones, from 0.
                env.insert("NVIDIA_VISIBLE_DEVICES".into(), names.join(","));
                env.insert(
                    "CUDA_VISIBLE_DEVICES".into(),
                    (0..s.gpus.len()).map(|i| i.to_string()).collect::<Vec<_>>().join(","),
                );
                Some(edits)
            }
            _ => None,
        };
        let mut binds = vec![p.checkpoint_dir.clone(), p.run_dir.clone()];
        binds.extend(p.default_workdir.clone());
        if p.who.allocated && p.who.home.is_dir() {
            binds.push(p.who.home.clone());
        }
        let read_only: Vec<PathBuf> =
            ["/etc/resolv.conf", "/etc/hosts"].iter().map(PathBuf::from).filter(|f| f.is_file()).collect();
        let cwd = match (&s.workdir, &p.default_workdir, &lease.config.working_dir) {
            (Some(dir), _, _) => PathBuf::from(dir),
            (None, Some(dir), _) => dir.clone(),
            (None, None, Some(dir)) => PathBuf::from(dir),
            (None, None, None) => PathBuf::from("/"),
        };
        let id = format!("{}.{}", s.attempt.job, s.attempt.attempt);
        let spec = container::Spec {
            id: id.clone(),
            argv: &s.argv,
            env: &env,
            cwd: &cwd,
            who: &p.who,
            root: image.root,
            hostname: format!("ebb-job-{}", s.attempt.job),
            binds,
            read_only,
            gpus,
        };
        let bundle = container::bundle(&p.run_dir, &spec)
            .map_err(|source| ImageError::Bundle { reference: image.reference.clone(), source })?;
        let exe = std::env::current_exe().map_err(StartError::OwnProgram)?;
        let state = self.config.data_dir.join("runc");
        let mut argv = vec![exe.display().to_string(), "container-shim".to_string()];
        argv.extend(container::shim_args(&self.config.images.runtime, &state, &bundle, &id, &lease.rootfs));
        let shim_env = BTreeMap::from([("PATH".to_string(), identity::DEFAULT_PATH.to_string())]);
        // The shim stays root; the job inside is the tenant's.
        let root = Identity { switch: false, ..p.who.clone() };
        let join = p.cgroup.as_ref().map_or_else(Vec::new, |ready| ready.join.fds());
        let request =
            spawn::Request { argv: &argv, env: &shim_env, cwd: &p.run_dir, who: &root, join: &join };
        let child =
            spawn::spawn(&request).map_err(|e| ImageError::Shim { exe: exe.clone(), cause: e.cause() })?;
        Ok((child, Some(Shim { error_file: bundle.error_file(), id })))
    }
}
