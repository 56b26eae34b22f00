//! A small OpenID Connect-style token issuer for tests, started inside the
//! test on 127.0.0.1: it publishes `/.well-known/openid-configuration` and a
//! JWKS (RSA and P-256 keys, with `Cache-Control: max-age`), counts the
//! fetches, can rotate its keys and "go down" (answer 503), and signs tokens
//! with nested role claims (Keycloak's `realm_access.roles`).
//!
//! The keys are fixed test keys (no key generation in tests: an RSA key
//! takes seconds in a debug build); they sign nothing outside tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// One of the issuer's signing keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestKey {
    /// RSA 2048, kid `rsa-1` (RS256).
    Rsa1,
    /// RSA 2048, kid `rsa-2` (RS256): the key rotated in.
    Rsa2,
    /// P-256, kid `ec-1` (ES256).
    P256a,
    /// P-256, kid `ec-2` (ES256): the key rotated in.
    P256b,
}

impl TestKey {
    /// Its `kid`.
    pub fn kid(self) -> &'static str {
        match self {
            TestKey::Rsa1 => "rsa-1",
            TestKey::Rsa2 => "rsa-2",
            TestKey::P256a => "ec-1",
            TestKey::P256b => "ec-2",
        }
    }

    /// The algorithm it signs with.
    pub fn alg(self) -> Algorithm {
        match self {
            TestKey::Rsa1 | TestKey::Rsa2 => Algorithm::RS256,
            TestKey::P256a | TestKey::P256b => Algorithm::ES256,
        }
    }

    fn encoding(self) -> EncodingKey {
        let pem = match self {
            TestKey::Rsa1 => RSA_1_PEM,
            TestKey::Rsa2 => RSA_2_PEM,
            TestKey::P256a => P256_1_PEM,
            TestKey::P256b => P256_2_PEM,
        };
        match self.alg() {
            Algorithm::RS256 => EncodingKey::from_rsa_pem(pem.as_bytes()),
            _ => EncodingKey::from_ec_pem(pem.as_bytes()),
        }
        .unwrap_or_else(|e| panic!("test key {}: {e}", self.kid()))
    }

    /// Its public JWK (no `alg`: the gateway pins it from the key type).
    pub fn jwk(self) -> Value {
        match self {
            TestKey::Rsa1 | TestKey::Rsa2 => {
                let n = if self == TestKey::Rsa1 {
                    RSA_1_N
                } else {
                    RSA_2_N
                };
                json!({"kty": "RSA", "use": "sig", "kid": self.kid(), "n": n, "e": "AQAB"})
            }
            TestKey::P256a | TestKey::P256b => {
                let (x, y) = if self == TestKey::P256a {
                    (P256_1_X, P256_1_Y)
                } else {
                    (P256_2_X, P256_2_Y)
                };
                json!({"kty": "EC", "crv": "P-256", "use": "sig", "kid": self.kid(), "x": x, "y": y})
            }
        }
    }
}

struct State {
    keys: Mutex<Vec<TestKey>>,
    down: AtomicBool,
    jwks_fetches: AtomicUsize,
    discovery_fetches: AtomicUsize,
    max_age: Mutex<u32>,
}

/// A running test issuer; stops when dropped.
pub struct TestIssuer {
    addr: std::net::SocketAddr,
    issuer: String,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestIssuer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestIssuer {
    /// Starts an issuer publishing `keys`, whose `iss` is
    /// `http://127.0.0.1:PORT/realms/{realm}`.
    pub async fn start(realm: &str, keys: &[TestKey]) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let issuer = format!("http://{addr}/realms/{realm}");
        let state = Arc::new(State {
            keys: Mutex::new(keys.to_vec()),
            down: AtomicBool::new(false),
            jwks_fetches: AtomicUsize::new(0),
            discovery_fetches: AtomicUsize::new(0),
            max_age: Mutex::new(300),
        });
        let task = tokio::spawn(serve(listener, issuer.clone(), Arc::clone(&state)));
        Ok(Self {
            addr,
            issuer,
            state,
            task,
        })
    }

    /// The `iss` of its tokens.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Its OpenID Connect discovery URL.
    pub fn discovery_url(&self) -> String {
        format!("{}/.well-known/openid-configuration", self.issuer)
    }

    /// Its JWKS URL.
    pub fn jwks_url(&self) -> String {
        format!("http://{}/realms/jwks", self.addr)
    }

    /// Publishes `keys` from now on (key rotation).
    pub fn publish(&self, keys: &[TestKey]) {
        *self.state.keys.lock() = keys.to_vec();
    }

    /// While down, every request is answered 503.
    pub fn set_down(&self, down: bool) {
        self.state.down.store(down, Ordering::SeqCst);
    }

    /// The JWKS `Cache-Control: max-age` (seconds) from now on.
    pub fn set_max_age(&self, seconds: u32) {
        *self.state.max_age.lock() = seconds;
    }

    /// JWKS requests answered 200 so far.
    pub fn jwks_fetches(&self) -> usize {
        self.state.jwks_fetches.load(Ordering::SeqCst)
    }

    /// Discovery requests answered 200 so far.
    pub fn discovery_fetches(&self) -> usize {
        self.state.discovery_fetches.load(Ordering::SeqCst)
    }

    /// A token signed by `key` with these claims over the defaults: `iss`
    /// (this issuer), `aud` `gateway`, `sub`, `exp` in an hour, `iat`, and
    /// roles in `realm_access.roles` (Keycloak's shape).
    pub fn token(&self, key: TestKey, sub: &str, roles: &[&str], extra: Value) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut claims = json!({
            "iss": self.issuer,
            "aud": "gateway",
            "sub": sub,
            "exp": now + 3600,
            "iat": now,
            "realm_access": {"roles": roles},
        });
        if let (Value::Object(c), Value::Object(e)) = (&mut claims, extra) {
            c.extend(e);
        }
        sign(key, &claims)
    }
}

/// `claims` signed by `key` (header with its `kid` and algorithm).
pub fn sign(key: TestKey, claims: &Value) -> String {
    let mut header = Header::new(key.alg());
    header.kid = Some(key.kid().to_owned());
    jsonwebtoken::encode(&header, claims, &key.encoding())
        .unwrap_or_else(|e| panic!("signing with {}: {e}", key.kid()))
}

async fn serve(listener: tokio::net::TcpListener, issuer: String, state: Arc<State>) {
    while let Ok((mut stream, _)) = listener.accept().await {
        let (issuer, state) = (issuer.clone(), Arc::clone(&state));
        tokio::spawn(async move {
            let mut buf = Vec::with_capacity(1024);
            let mut chunk = [0u8; 1024];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
                if buf.len() > 16 * 1024 {
                    return;
                }
            }
            let head = String::from_utf8_lossy(&buf);
            let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
            let (status, body, max_age) = if state.down.load(Ordering::SeqCst) {
                ("503 Service Unavailable", String::from("down"), None)
            } else if path.ends_with("/.well-known/openid-configuration") {
                state.discovery_fetches.fetch_add(1, Ordering::SeqCst);
                let base = issuer.split("/realms/").next().unwrap_or_default();
                let doc = json!({
                    "issuer": issuer,
                    "jwks_uri": format!("{base}/realms/jwks"),
                    "id_token_signing_alg_values_supported": ["RS256", "ES256"],
                });
                ("200 OK", doc.to_string(), None)
            } else if path == "/realms/jwks" {
                state.jwks_fetches.fetch_add(1, Ordering::SeqCst);
                let keys: Vec<Value> = state.keys.lock().iter().map(|k| k.jwk()).collect();
                let max_age = *state.max_age.lock();
                ("200 OK", json!({"keys": keys}).to_string(), Some(max_age))
            } else {
                ("404 Not Found", String::from("not found"), None)
            };
            let cache = max_age.map_or(String::new(), |s| {
                format!("cache-control: public, max-age={s}\r\n")
            });
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{cache}content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

/// A fixed 2048-bit RSA test key: PKCS#8 PEM and the JWK's `n`.
const RSA_1_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIIEvwIBADANBgkqhkiG9w0BAQEFAASCBKkwggSlAgEAAoIBAQDeExl6XZ9+serZ
Gy2+3LJPl2MH+3RTyAPRgmvYrdltY5XvxdY/ASNCReHEFRay4+/RnCckS7a3ipaZ
eDwErGEkz91LnpteHLRnwRMmA+ZmCJi+IaNonhzOY5xCZHf8YzbN2F4xq4EDNfLm
pPGJulWVYDgKdvBQgIbp3sjwUxghKzIIkNHVHxcJf5+rKVdt6GUmNgVpzfridcLp
c3OuzbAzOs5n55kzhSAvjYS4QSgPuoP7XGykwo76CZgDxzFDiwE4IrrWDZFmlQqF
m6U1DUB9o9ixsS/lcetFr2kxNDhTIy8thpGdJUFQuiR0MSsuMuuprvUT9yOyF1Ij
u8s1GRwJAgMBAAECggEAYBLSPGqBhF2zVK6Z6U7wQ1eii8MAzfgjksGCJ7D6dgUV
yjAEIqi62MKDzAE1mznaOAv+sQiiaSAnTAjEql7q/fKBceQRojL350UTpCgexnik
n+jMmYeBvdZBNUXi1MkVXhNjmMhyHXH6/kZQin2W5fNE+13+VE1uUIJF2xaPw1Tu
bcCavQ8mY2TrdkI0Bb0VZhRN5K4tM0lXzLL7MW2PZvATZp4e5+OA3qtfLt8wKwwf
IkIPmeuBwrT98omfZaKQAa0gJ+FHo0Ex6rKjY8tRhgGqmtwmJ31wVCI8P5eHdmxM
jaVr1XpNTS/8vBmpG6XIN0Y4f8j7WShnJRjvuwdRgwKBgQD+BSKSFEhLeE+b3qbU
g0DV/h7Q4AJCM1uiZyt2d+bnOeBh2x1AGQ1XfkIqg+mZw/3vL8y4qgNQdB36U4Ba
W7Tts0fq5EPdw5MuSvDLrGiN9cteitNJfcp5BnIwO9lj+YuAtBDXcXD4+xyE8Edw
WUcyYBu5XNtu3vE+xdCnhNoREwKBgQDfzjirgGhkK0SRCnLTPaQM1RaIZZ/N9iue
yUVJLYW8g4btAs5jbsUMg4Oh8ruLcMRpk/r9NftncQP5rqMlO0HbOpanCH8zpKk/
DNERymxxU/UqmG3ZAkO3TlzKIsBEc8eAFT7DIhLItP0H3DuhtbHAzJbVXECRGX0D
0+AEWl1d8wKBgQC1G+goCrn4xRDNaxO7VNF3QTWrautxU7izs6czUg2ZMpSecGEM
gFAY33ZBZce50BlO3d+ykdTHGeL9xWcwBU6cY0SVXqZciMJ5MQk5zfTFskeLYqN+
NGeVnljvttwqAZPK8ZdIZCNOAYu15LKqkZzHd+qMYH47ME0EmnlH1tq7bQKBgQCn
9RyEYI53Nh1z9/JqY2UdGEGbxSBjsi3UMVok69vkuJRmhGedKYEJvhzoScDDibJt
RVfj9UIhxCfmlk/rXggzXUm4OuEzQYyeO6EfB9nQRuDDwbcWV+O3ykBKlj/SX01F
6yu5x3VvWJxX7Mh3uGKYvTEpF92Axy8R00zYF3TgTwKBgQCJNzUooEEYP4tUmw0h
Scq88+aELYhc53Q32ZYrP3SCuAMAMy7Mq8HiffszkvTnBq5yZBhWtSp105t4aorS
cBOjk177Z7sKrAl76k8WFj0cXGvbtlKTYHCKaWfkbxNZ976PzcOGklGuioYrTJzs
iiOnIIQ/kSqhlhNvK7P2Td7YLA==
-----END PRIVATE KEY-----\n";
const RSA_1_N: &str = "3hMZel2ffrHq2RstvtyyT5djB_t0U8gD0YJr2K3ZbWOV78XWPwEjQkXhxBUWsuPv0ZwnJEu2t4qWmXg8BKxhJM_dS56bXhy0Z8ETJgPmZgiYviGjaJ4czmOcQmR3_GM2zdheMauBAzXy5qTxibpVlWA4CnbwUICG6d7I8FMYISsyCJDR1R8XCX-fqylXbehlJjYFac364nXC6XNzrs2wMzrOZ-eZM4UgL42EuEEoD7qD-1xspMKO-gmYA8cxQ4sBOCK61g2RZpUKhZulNQ1AfaPYsbEv5XHrRa9pMTQ4UyMvLYaRnSVBULokdDErLjLrqa71E_cjshdSI7vLNRkcCQ";

/// A fixed 2048-bit RSA test key: PKCS#8 PEM and the JWK's `n`.
const RSA_2_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDdoH8jgS7B+oxr
1Ud86+bp8+YlDIKzVfxzBi3Cws7bOXvR711smaH7BrkvUpi29tldgNFisz1Y/DPI
cTPDe+orRw24ihxo7a44F+fpjWKtnda3ZZCltVot2TduQze24EC2lIKre2oqDHuS
Pfy6dI3IKZGv6qbFJoUNdjwM1jw14J2GRgg4Elv5DH/G/vZj2numnsnG/EtY5kSI
hGUKNmyzOgot/op37qutls4ez0x65BQwjMJe8Ebwrn7wlVyly/9SKz350G9aRVoD
pCo9PXc+SVIY5jU0/oYXr79GAovBY2zJ3MAEIYHp9U5400hyqW6+CTqJ1+/VLaft
xILLLemTAgMBAAECggEAA6WtAfIRyWpsnier3f/p1GbJnkl26ymalm//F8np6oyn
H3zPbkaW9lEVghRbZANq71F74KJve4Pm/ED0p55l66FnNea78fQbXlvyWpMTkSTc
UDdRKpDx83g0I9HiXFWTaw3FmrnUtO1wqSbw/kaFwMoCVkFHzk3EecS81z89TWul
gNvt6zRRfKdurHZKh7fxC6PgjWMP79L8gqlb6t0MuwJ1UZbO2tCb/Q0CWLCd6cWG
U67pLwnnAAUTAyokNznCFJjbs5++PAI59TPsYvovFMfBCPMgvl5YSkX9GVFe+BaG
6vd26H4qyam36M5BayEpBOcrAMOW8TCNZp5g+qL/YQKBgQD+BesOZBUSczrJilZa
W4B8MNtusKn9Z/Pz33nVHQyNfQsqPHCH8UspoxI8ywIncA0ITwz3Z+KVLOIppZKo
2vE/GJ8lCPvZntLKZ4OVN2QNYjz66NwoSjQyLk4PHRLKUX9bWiYIx48BLgT6fGCc
khOcK9RY1+tIHQRnRDW3llcH8wKBgQDfWglf3TDAGA5mY1uV+jwlTPRTjCWaSBQP
d9GTUL8nPQWdHRTY9SQ1GKRH0Ko6Mchsy7lEY92eUbnPmU4YOuXVn0YA2izM3Dai
QoyucdWaDbJsJXASfwE9kjOrVv4quA0hlC1tyCBDS+Z1zh9Nbr/NGL/Dcmgn1MPg
IdYZakCf4QKBgCM9pvKEJ/g7TDiRnJFEiHqyPH8Ku0qQlWOL6VcLhKZMZrQhVmtF
qmvIV8tfTpkyDlzMurvICcMwSuAEPGh4l2dtfwagTHBQfGXgHn0hBhxlOJiGnaRp
Rvx/OA0Yt3ah/80ooIYvSUOcoswtXSnbiiTsX7VDnzyN6gJ5kAo8LS7JAoGATQA7
byNQpUkl3cKvVntYtPtc2FjetdvXnqWOSR1zaVGuV8Yo48tP2kZOjLuxlDKJiIiL
rLpJM0W1q46Mz+muRwGMHssY2t+orjQHUDTKkTvboVEe3CGRCesXiSCKq6ucS1FM
gCaYiNrn7wFK5WUjFtBLfFQ6+FBv3xuLNmPdN8ECgYEAhxCowJtJkNuqBh6C1wFk
O9mOdJkLrOgg+sc9PACn7DAIe26OcurX07IefBoHej3P+lAyQI7iQkA/yzIxqr8G
65Keq6sVJq+1uPlHuJBcGhlbEtcwiy9wobH5hKj5864m3+2HEwQnBZMPMxvqma6l
q7uiJKR9VT/zlp7BArxJsuE=
-----END PRIVATE KEY-----\n";
const RSA_2_N: &str = "3aB_I4EuwfqMa9VHfOvm6fPmJQyCs1X8cwYtwsLO2zl70e9dbJmh-wa5L1KYtvbZXYDRYrM9WPwzyHEzw3vqK0cNuIocaO2uOBfn6Y1irZ3Wt2WQpbVaLdk3bkM3tuBAtpSCq3tqKgx7kj38unSNyCmRr-qmxSaFDXY8DNY8NeCdhkYIOBJb-Qx_xv72Y9p7pp7JxvxLWOZEiIRlCjZsszoKLf6Kd-6rrZbOHs9MeuQUMIzCXvBG8K5-8JVcpcv_Uis9-dBvWkVaA6QqPT13PklSGOY1NP6GF6-_RgKLwWNsydzABCGB6fVOeNNIcqluvgk6idfv1S2n7cSCyy3pkw";

/// A fixed P-256 test key: PKCS#8 PEM and the JWK's `x` and `y`.
const P256_1_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgB/wCwuuHYue6aZ78
M/fkTCsIgQwBpqF5KTg9T9KUpYChRANCAAQRrha/lPqhLmjNUIWf+dPKqLkLakMd
pdQefBX66nXe6RItxeOGfyvHwGQc5dR/b5s5x/BP7iUM0yDceWj0WLYg
-----END PRIVATE KEY-----\n";
const P256_1_X: &str = "Ea4Wv5T6oS5ozVCFn_nTyqi5C2pDHaXUHnwV-up13uk";
const P256_1_Y: &str = "Ei3F44Z_K8fAZBzl1H9vmznH8E_uJQzTINx5aPRYtiA";

/// A fixed P-256 test key: PKCS#8 PEM and the JWK's `x` and `y`.
const P256_2_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgl4Tr2jL1KK9RwdzF
IztCVUO7QWQHkTCSVTpqBCIETPuhRANCAAQMNUeeMksdPbL5TJFktsru41woIeL/
B+XdzHwl7YCXjAcjeGZrFs0iXN77yAYgxYaNqe3vSZUsfRYrfrAvXj4d
-----END PRIVATE KEY-----\n";
const P256_2_X: &str = "DDVHnjJLHT2y-UyRZLbK7uNcKCHi_wfl3cx8Je2Al4w";
const P256_2_Y: &str = "ByN4ZmsWzSJc3vvIBiDFho2p7e9JlSx9Fit-sC9ePh0";
