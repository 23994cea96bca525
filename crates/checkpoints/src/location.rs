//! Where the store is and who may use it: `--checkpoint-store` and its
//! companions checked into a [`Store`], and the credentials a process
//! holds for it ([`Credentials`]: a file, or the standard `AWS_*`
//! variables; never a flag, so no secret is on a command line).
//!
//! The location travels (the server hands it to agents); credentials do
//! not: each agent reads its own, so an operator can give nodes keys
//! limited to the bucket's prefix, and rotate them, without the server
//! holding or sending secrets.

use std::sync::Arc;
use std::time::Duration;

use ebb_api::CheckpointStoreLocation;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, RetryConfig};

/// Why the store cannot be used, or an object cannot be trusted.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A flag's value is wrong: retrying cannot help.
    #[error("{flag} {value}: {why}")]
    Config { flag: &'static str, value: String, why: String },
    /// Credentials are missing or unreadable: retrying cannot help.
    #[error("{0}")]
    Credentials(String),
    /// The service said no, or could not be reached; retrying may help.
    #[error("checkpoint store {store}: {source}")]
    Store { store: String, source: object_store::Error },
    /// An object is not what its manifest says: never retried, the
    /// checkpoint is refused.
    #[error("{0}")]
    Integrity(String),
    /// A local file or directory.
    #[error("{0}")]
    Local(String),
    /// Over a limit the operator set: never retried.
    #[error("{0}")]
    Limit(String),
}

impl StoreError {
    /// Whether trying again later may succeed.
    pub fn retryable(&self) -> bool {
        matches!(self, StoreError::Store { .. } | StoreError::Local(_))
    }
}

/// Access keys for an S3 store.
#[derive(Clone)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
    /// Where they came from, for messages (never the secret).
    pub source: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, key id {})", self.source, self.access_key_id)
    }
}

impl Credentials {
    /// From `file` (`flag` names it in errors) if given, else from
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and
    /// `AWS_SESSION_TOKEN`; none if neither.
    pub fn load(
        flag: &'static str,
        file: Option<&std::path::Path>,
    ) -> Result<Option<Credentials>, StoreError> {
        match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| StoreError::Credentials(format!("{flag} {}: {e}", path.display())))?;
                Credentials::parse(&text, &format!("{flag} {}", path.display())).map(Some)
            }
            None => {
                let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
                match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
                    (Some(access_key_id), Some(secret_access_key)) => Ok(Some(Credentials {
                        access_key_id,
                        secret_access_key,
                        session_token: var("AWS_SESSION_TOKEN"),
                        source: "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY".into(),
                    })),
                    (Some(_), None) | (None, Some(_)) => Err(StoreError::Credentials(
                        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY: set both or neither".into(),
                    )),
                    (None, None) => Ok(None),
                }
            }
        }
    }

    /// An AWS shared credentials file (`aws_access_key_id = ...`, its
    /// `[default]` profile or no section), or `KEY=VALUE` lines of the
    /// variables' names.
    pub fn parse(text: &str, source: &str) -> Result<Credentials, StoreError> {
        let (mut id, mut secret, mut token) = (None, None, None);
        let mut section: Option<String> = None;
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = Some(name.trim().to_string());
                continue;
            }
            if section.as_deref().is_some_and(|s| s != "default") {
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                return Err(StoreError::Credentials(format!("{source}: expected KEY = VALUE lines")));
            };
            let value = Some(value.trim().trim_matches('"').to_string());
            match key.trim().to_ascii_lowercase().as_str() {
                "aws_access_key_id" => id = value,
                "aws_secret_access_key" => secret = value,
                "aws_session_token" => token = value,
                _ => {}
            }
        }
        match (id, secret) {
            (Some(access_key_id), Some(secret_access_key)) => Ok(Credentials {
                access_key_id,
                secret_access_key,
                session_token: token,
                source: source.to_string(),
            }),
            _ => Err(StoreError::Credentials(format!(
                "{source}: needs aws_access_key_id and aws_secret_access_key (in [default] or no section)"
            ))),
        }
    }
}

/// An open store: the objects under the location's prefix.
#[derive(Clone)]
pub struct Store {
    pub(crate) objects: Arc<dyn ObjectStore>,
    pub(crate) prefix: ObjectPath,
    /// The URL, for messages.
    pub(crate) url: String,
    /// A `file://` store's directory: what is stored there is made private
    /// to the job's user (the rest of the store's kind decides alone).
    pub(crate) local: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({})", self.url)
    }
}

/// How long one request to the service may take, and how long retries of
/// one operation may go on: a checkpoint that cannot be stored in this
/// time is reported as failed, and the next report tries again.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
const RETRY_TIMEOUT: Duration = Duration::from_secs(30);

impl Store {
    /// Checks `location` (`flag` names its URL in messages: the server's
    /// `--checkpoint-store`, or what an agent was told at registration) and
    /// opens it. Makes nothing and calls nothing: [`Store::check`] does.
    pub fn open(
        location: &CheckpointStoreLocation,
        credentials: Option<&Credentials>,
    ) -> Result<Store, StoreError> {
        let url = location.url.trim();
        let bad =
            |why: String| StoreError::Config { flag: "--checkpoint-store", value: url.to_string(), why };
        let (scheme, rest) =
            url.split_once("://").ok_or_else(|| bad("a URL: s3://BUCKET/PREFIX or file:///PATH".into()))?;
        match scheme {
            "file" => {
                if location.endpoint.is_some() || location.region.is_some() {
                    return Err(bad(
                        "--checkpoint-store-endpoint and --checkpoint-store-region are for s3:// stores"
                            .into(),
                    ));
                }
                if !rest.starts_with('/') {
                    return Err(bad("an absolute path: file:///PATH (three slashes)".into()));
                }
                let dir = std::path::Path::new(rest);
                std::fs::create_dir_all(dir)
                    .map_err(|e| bad(format!("cannot make {}: {e}", dir.display())))?;
                let local = LocalFileSystem::new_with_prefix(dir).map_err(|e| bad(e.to_string()))?;
                Ok(Store {
                    objects: Arc::new(local),
                    prefix: ObjectPath::default(),
                    url: url.to_string(),
                    local: Some(dir.to_path_buf()),
                })
            }
            "s3" => {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                if bucket.is_empty() {
                    return Err(bad("no bucket: s3://BUCKET/PREFIX".into()));
                }
                let Some(credentials) = credentials else {
                    return Err(StoreError::Credentials(format!(
                        "checkpoint store {url}: no credentials: give --checkpoint-store-credentials FILE \
                         (an AWS credentials file) or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
                    )));
                };
                let mut builder = AmazonS3Builder::new()
                    .with_bucket_name(bucket)
                    .with_access_key_id(&credentials.access_key_id)
                    .with_secret_access_key(&credentials.secret_access_key)
                    .with_region(location.region.as_deref().unwrap_or("us-east-1"))
                    .with_retry(RetryConfig {
                        max_retries: 5,
                        retry_timeout: RETRY_TIMEOUT,
                        ..RetryConfig::default()
                    })
                    .with_client_options(
                        ClientOptions::new()
                            .with_connect_timeout(Duration::from_secs(5))
                            .with_timeout(REQUEST_TIMEOUT),
                    );
                if let Some(token) = &credentials.session_token {
                    builder = builder.with_token(token);
                }
                if let Some(endpoint) = &location.endpoint {
                    let endpoint = endpoint.trim_end_matches('/');
                    let plain = endpoint.starts_with("http://");
                    if !plain && !endpoint.starts_with("https://") {
                        return Err(StoreError::Config {
                            flag: "--checkpoint-store-endpoint",
                            value: endpoint.to_string(),
                            why: "a URL: https://HOST[:PORT] (or http:// for a service on a trusted network)"
                                .into(),
                        });
                    }
                    builder = builder.with_endpoint(endpoint).with_allow_http(plain);
                }
                let s3 = builder.build().map_err(|e| bad(e.to_string()))?;
                let prefix = ObjectPath::parse(prefix.trim_matches('/')).map_err(|e| bad(e.to_string()))?;
                Ok(Store { objects: Arc::new(s3), prefix, url: url.to_string(), local: None })
            }
            other => Err(bad(format!("unknown scheme {other}://: s3://BUCKET/PREFIX or file:///PATH"))),
        }
    }

    /// Lists the top of the prefix: the bucket exists, the service answers
    /// and the credentials are good, or the error says which is not.
    pub async fn check(&self, within: Duration) -> Result<(), StoreError> {
        let listed = tokio::time::timeout(within, self.objects.list_with_delimiter(Some(&self.prefix))).await;
        match listed {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(source)) => Err(self.failed(source)),
            Err(_) => Err(StoreError::Local(format!(
                "checkpoint store {}: no answer within {}s (is the endpoint right, and reachable?)",
                self.url,
                within.as_secs()
            ))),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub(crate) fn failed(&self, source: object_store::Error) -> StoreError {
        StoreError::Store { store: self.url.clone(), source }
    }

    /// The store of one job: `<prefix>/<tenant>/<job>`. The tenant name is
    /// the server's (letters, digits, `-`, `_`); anything else is refused
    /// rather than trusted as a key.
    pub fn job(&self, tenant: &str, job: u64) -> Result<crate::JobStore, StoreError> {
        let tenant = if tenant.is_empty() { "default" } else { tenant };
        if !tenant.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(StoreError::Local(format!("tenant {tenant:?}: not a valid tenant name")));
        }
        let prefix = self.prefix.child(tenant).child(job.to_string());
        Ok(crate::JobStore { store: self.clone(), prefix })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(url: &str) -> CheckpointStoreLocation {
        CheckpointStoreLocation { url: url.into(), endpoint: None, region: None }
    }

    fn keys() -> Credentials {
        Credentials::parse("aws_access_key_id=a\naws_secret_access_key=b\n", "test").unwrap()
    }

    #[test]
    fn a_bad_store_url_says_which_flag_and_what_is_wrong() {
        let err = |url: &str| Store::open(&at(url), Some(&keys())).unwrap_err().to_string();
        assert_eq!(
            err("gs://bucket/x"),
            "--checkpoint-store gs://bucket/x: unknown scheme gs://: s3://BUCKET/PREFIX or file:///PATH"
        );
        assert_eq!(err("s3:///prefix"), "--checkpoint-store s3:///prefix: no bucket: s3://BUCKET/PREFIX");
        assert_eq!(err("bucket"), "--checkpoint-store bucket: a URL: s3://BUCKET/PREFIX or file:///PATH");
        assert!(err("file://relative/dir").contains("an absolute path"));
        let mut odd = at("s3://bucket");
        odd.endpoint = Some("localhost:9000".into());
        let e = Store::open(&odd, Some(&keys())).unwrap_err().to_string();
        assert!(e.starts_with("--checkpoint-store-endpoint localhost:9000: a URL"), "{e}");
        let e = Store::open(&at("s3://bucket"), None).unwrap_err().to_string();
        assert!(e.contains("no credentials") && e.contains("--checkpoint-store-credentials"), "{e}");
    }

    #[test]
    fn credentials_come_from_the_default_profile_of_an_aws_file() {
        let text = "[other]\naws_access_key_id = wrong\n[default]\naws_access_key_id = AK\n\
                    aws_secret_access_key = \"SK\"\n";
        let c = Credentials::parse(text, "f").unwrap();
        assert_eq!((c.access_key_id.as_str(), c.secret_access_key.as_str()), ("AK", "SK"));
        assert!(!format!("{c:?}").contains("SK"), "the secret is never printed");
        let e = Credentials::parse("aws_access_key_id = AK\n", "f").unwrap_err().to_string();
        assert!(e.contains("aws_secret_access_key"), "{e}");
    }
}
