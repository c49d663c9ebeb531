//! TLS credentials in QEMU's x509 layout: a directory holding `ca-cert.pem`,
//! `server-cert.pem` and `server-key.pem` (QEMU's `tls-creds-x509,endpoint=server,dir=`),
//! made into a rustls server configuration.
//!
//! This module owns reading those files and the choices a server makes with them (TLS 1.2
//! and 1.3, rustls's safe defaults, client certificates required and checked against the CA
//! when `verify_peer`, as QEMU's `verify-peer=on`, its default); the session on a connection
//! is the `connection` module's.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

/// Why credentials could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read or holds no PEM of the kind wanted.
    #[error("{}: {reason}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The certificates and key do not make a configuration (a key that is not the
    /// certificate's, a CA certificate rustls refuses).
    #[error("{dir}: {source}", dir = dir.display())]
    Config {
        /// The credentials' directory.
        dir: PathBuf,
        /// What rustls said.
        #[source]
        source: rustls::Error,
    },
}

impl From<TlsError> for std::io::Error {
    fn from(e: TlsError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, e)
    }
}

/// A server's TLS credentials, cheap to clone.
#[derive(Clone)]
pub struct TlsCreds {
    config: Arc<ServerConfig>,
    dir: PathBuf,
    verify_peer: bool,
}

impl std::fmt::Debug for TlsCreds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsCreds")
            .field("dir", &self.dir)
            .field("verify_peer", &self.verify_peer)
            .finish_non_exhaustive()
    }
}

/// The certificates of the PEM file at `path` (at least one).
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file = |reason: String| TlsError::File {
        path: path.to_path_buf(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file(e.to_string()))?;
    if certs.is_empty() {
        return Err(file("no certificate in it".into()));
    }
    Ok(certs)
}

impl TlsCreds {
    /// The credentials in `dir` (QEMU's layout); `verify_peer`: clients must present a
    /// certificate the CA signed.
    pub fn from_qemu_dir(dir: &Path, verify_peer: bool) -> Result<Self, TlsError> {
        // ring: it builds with a C compiler alone (aws-lc-rs needs more tools), so the
        // README's commands work on a fresh machine. rustls deprecates it only for lacking
        // post-quantum key exchange, which QEMU's GnuTLS clients do not offer either.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config_error = |source| TlsError::Config {
            dir: dir.to_path_buf(),
            source,
        };
        let chain = certificates(&dir.join("server-cert.pem"))?;
        let key_path = dir.join("server-key.pem");
        let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| TlsError::File {
            path: key_path.clone(),
            reason: e.to_string(),
        })?;
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(config_error)?;
        let config = if verify_peer {
            let mut roots = RootCertStore::empty();
            for ca in certificates(&dir.join("ca-cert.pem"))? {
                roots.add(ca).map_err(config_error)?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| config_error(rustls::Error::General(e.to_string())))?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        }
        .with_single_cert(chain, key)
        .map_err(config_error)?;
        Ok(TlsCreds {
            config: Arc::new(config),
            dir: dir.to_path_buf(),
            verify_peer,
        })
    }

    /// The rustls configuration.
    pub fn config(&self) -> &Arc<ServerConfig> {
        &self.config
    }

    /// Whether clients must present a certificate.
    pub fn verify_peer(&self) -> bool {
        self.verify_peer
    }

    /// The directory they came from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
