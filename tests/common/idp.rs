//! An in-test OAuth 2.1 authorization server ([`Idp`]): an OpenID configuration and a JWK Set
//! on a loopback port, ES256 keys generated per test ([`new_key`]), and RFC 9068 access tokens
//! signed with them ([`sign`]). Used by `tests/oauth.rs` and the tier's OAuth test
//! (`tests/tier_oauth.rs`); the real `oidc-provider` run is `tests/oauth/run.sh`.

use super::*;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use p256::pkcs8::EncodePrivateKey;

/// The audience (resource) the tokens are for, and taskgate's `auth.oauth.audience`.
pub const AUDIENCE: &str = "https://mcp.example.com/mcp";

/// A signing key: its `kid`, the private key, and its public JWK (as the JWK Set lists it).
pub struct TestKey {
    pub kid: String,
    pub enc: EncodingKey,
    pub jwk: Value,
}

/// A fresh ES256 key named `kid`.
pub fn new_key(kid: &str) -> TestKey {
    let secret = p256::SecretKey::random(&mut rand::rngs::OsRng);
    let der = secret.to_pkcs8_der().unwrap();
    let enc = EncodingKey::from_ec_der(der.as_bytes());
    let mut jwk =
        serde_json::to_value(Jwk::from_encoding_key(&enc, Algorithm::ES256).unwrap()).unwrap();
    jwk["kid"] = json!(kid);
    jwk["use"] = json!("sig");
    TestKey {
        kid: kid.into(),
        enc,
        jwk,
    }
}

/// What the authorization server serves: the JWK Set's keys; `hang`: answer nothing.
#[derive(Default)]
pub struct IdpState {
    pub keys: Vec<Value>,
    pub hang: bool,
}

/// A minimal authorization server: `/.well-known/openid-configuration` and `/jwks`.
pub struct Idp {
    pub up: Upstream,
    pub state: Arc<Mutex<IdpState>>,
}

impl Idp {
    pub async fn start(keys: &[&TestKey]) -> Idp {
        let state = Arc::new(Mutex::new(IdpState {
            keys: keys.iter().map(|k| k.jwk.clone()).collect(),
            hang: false,
        }));
        let s = state.clone();
        let issuer = Arc::new(Mutex::new(String::new()));
        let iss = issuer.clone();
        let up = Upstream::start(move |req| {
            let st = s.lock().unwrap();
            if st.hang {
                return ScriptedResponse::Hang;
            }
            match req.path.as_str() {
                "/.well-known/openid-configuration" => {
                    let i = iss.lock().unwrap().clone();
                    ScriptedResponse::json(
                        json!({"issuer": i, "jwks_uri": format!("{i}/jwks")}).to_string(),
                    )
                }
                "/jwks" => ScriptedResponse::json(json!({"keys": st.keys}).to_string()),
                _ => ScriptedResponse::status(404, None, "not found"),
            }
        })
        .await;
        *issuer.lock().unwrap() = up.url_path("");
        Idp { up, state }
    }
    pub fn issuer(&self) -> String {
        self.up.url_path("")
    }
    pub fn set_keys(&self, keys: &[&TestKey]) {
        self.state.lock().unwrap().keys = keys.iter().map(|k| k.jwk.clone()).collect();
    }
    pub fn jwks_fetches(&self) -> usize {
        self.up
            .requests()
            .iter()
            .filter(|r| r.path == "/jwks")
            .count()
    }
}

/// Claims of an access token for `sub` from `idp`, for [`AUDIENCE`], scopes `mcp other`, valid 5 min.
pub fn claims(idp: &Idp, sub: &str) -> Value {
    let now = now_ms() / 1000;
    json!({"iss": idp.issuer(), "aud": AUDIENCE, "sub": sub, "scope": "mcp other",
           "iat": now, "exp": now + 300})
}

/// An RFC 9068 access token (`typ: at+jwt`) signed with `key`.
pub fn sign(key: &TestKey, claims: &Value) -> String {
    sign_typed(key, claims, Some("at+jwt"))
}

pub fn sign_typed(key: &TestKey, claims: &Value, typ: Option<&str>) -> String {
    let mut h = Header::new(Algorithm::ES256);
    h.kid = Some(key.kid.clone());
    h.typ = typ.map(str::to_string);
    encode(&h, claims, &key.enc).unwrap()
}
