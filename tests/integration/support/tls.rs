//! Test certificates (rcgen) and a rustls client that reports what the server chose.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

/// A private CA for one test.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A leaf certificate and its key, as PEM and DER.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

impl TestCa {
    pub fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "throttle test CA");
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { issuer }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for `localhost` and 127.0.0.1.
    pub fn leaf(&self) -> Leaf {
        let params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }

    /// Writes `leaf` as `cert.pem` and `key.pem` into `dir`.
    pub fn write(leaf: &Leaf, dir: &Path) {
        std::fs::write(dir.join("cert.pem"), &leaf.cert_pem).unwrap();
        std::fs::write(dir.join("key.pem"), &leaf.key_pem).unwrap();
    }

    /// A rustls client trusting only this CA, offering h2 then http/1.1.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(self.issuer.der().clone()).unwrap();
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// Connects to `addr` as `localhost`: the TLS stream, the ALPN chosen and the
    /// certificate served.
    pub async fn connect(
        &self,
        addr: SocketAddr,
    ) -> (
        tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
        Option<Vec<u8>>,
        CertificateDer<'static>,
    ) {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let connector = tokio_rustls::TlsConnector::from(self.client_config());
        let name = ServerName::try_from("localhost").unwrap();
        let tls = connector.connect(name, tcp).await.unwrap();
        let (_, conn) = tls.get_ref();
        let alpn = conn.alpn_protocol().map(<[u8]>::to_vec);
        let served = conn.peer_certificates().unwrap()[0].clone().into_owned();
        (tls, alpn, served)
    }
}
