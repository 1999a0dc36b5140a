//! A headless Chromium driven through chromedriver's WebDriver HTTP API (W3C), with reqwest: the
//! few commands these tests need, and waiting for conditions with a generous ceiling rather
//! than sleeping. Debian's packages (`chromium`, `chromium-driver`) are found on `PATH`
//! (`SNAPFENCE_CHROMIUM` and `SNAPFENCE_CHROMEDRIVER` name others). When they are missing the
//! tests fail, saying how to install them, unless `SNAPFENCE_UI_BROWSER=skip` is set.
//!
//! chromedriver runs in a process group of its own with the browser under it; the group is
//! ended, and the profile directory removed, when the [`Browser`] is dropped, however the test
//! ends.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};

/// How long any condition may take to come true, however loaded the machine.
pub const CEILING: Duration = Duration::from_secs(30);

/// The window's size: wide enough for every table, as tall as a laptop's screen.
const WINDOW: (i64, i64) = (1360, 860);

/// The W3C name of an element reference in JSON.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// What a test needs from the environment; `None` when the tests are told to skip.
fn programs() -> Option<(PathBuf, PathBuf)> {
    let find = |var: &str, names: &[&str]| -> Option<PathBuf> {
        if let Some(p) = std::env::var_os(var) {
            return Some(PathBuf::from(p));
        }
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
            .find(|p| p.is_file())
    };
    let chromium = find(
        "SNAPFENCE_CHROMIUM",
        &["chromium", "chromium-browser", "google-chrome"],
    );
    let driver = find("SNAPFENCE_CHROMEDRIVER", &["chromedriver"]);
    match (chromium, driver) {
        (Some(c), Some(d)) => Some((c, d)),
        (c, d) => {
            let missing: Vec<&str> = [(c.is_none(), "chromium"), (d.is_none(), "chromedriver")]
                .into_iter()
                .filter_map(|(m, name)| m.then_some(name))
                .collect();
            if std::env::var("SNAPFENCE_UI_BROWSER").as_deref() == Ok("skip") {
                eprintln!(
                    "SNAPFENCE_UI_BROWSER=skip: browser test skipped ({} not found)",
                    missing.join(", ")
                );
                return None;
            }
            panic!(
                "the operator page's browser tests need Chromium and chromedriver, and {} {} \
                 not on PATH: run the tests with `scripts/test`, which installs them as root, or \
                 `apt-get install -y chromium chromium-driver`; set SNAPFENCE_UI_BROWSER=skip \
                 to skip these tests",
                missing.join(" and "),
                if missing.len() == 1 { "is" } else { "are" }
            );
        }
    }
}

/// Where the screenshots go: `target/ui-screenshots/`.
pub fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("CARGO_TARGET_TMPDIR is target/tmp")
        .join("ui-screenshots")
}

/// One browser session, and the chromedriver that runs it.
pub struct Browser {
    http: reqwest::Client,
    driver_port: u16,
    session: String,
    driver: Child,
    profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless browser, or answers `None` when the tests are told to
    /// skip and the programs are missing.
    pub async fn start() -> Option<Browser> {
        let (chromium, driver_path) = programs()?;
        let profile = tempfile::Builder::new()
            .prefix("sf-ui-")
            .tempdir()
            .expect("a profile directory");
        std::fs::create_dir(profile.path().join("downloads")).unwrap();
        let log = std::fs::File::create(profile.path().join("chromedriver.log")).unwrap();
        let driver = Command::new(&driver_path)
            .arg("--port=0")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", driver_path.display()));
        let mut browser = Browser {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
            driver_port: 0,
            session: String::new(),
            driver,
            profile,
        };
        browser.driver_port = browser.wait_for_port().await;
        browser.session = browser.new_session(&chromium).await;
        Some(browser)
    }

    /// chromedriver prints the port it chose; `--port=0` lets it pick a free one.
    async fn wait_for_port(&mut self) -> u16 {
        let log = self.profile.path().join("chromedriver.log");
        let deadline = Instant::now() + CEILING;
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let port = text
                .split("started successfully on port ")
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|digits| digits.parse().ok());
            if let Some(port) = port {
                return port;
            }
            if let Ok(Some(status)) = self.driver.try_wait() {
                panic!("chromedriver exited ({status}): {text}");
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not start within {CEILING:?}: {text}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn new_session(&self, chromium: &Path) -> String {
        let profile = self.profile.path();
        let args = [
            "--headless=new".to_string(),
            "--disable-gpu".into(),
            // As root (CI, these machines) Chromium refuses to start with its sandbox.
            "--no-sandbox".into(),
            "--disable-dev-shm-usage".into(),
            format!("--window-size={},{}", WINDOW.0, WINDOW.1),
            "--force-device-scale-factor=1".into(),
            "--hide-scrollbars".into(),
            "--lang=en-US".into(),
            "--no-first-run".into(),
            "--no-default-browser-check".into(),
            // Nothing but the test's server is reached: no updates, sync, pings or lookups.
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-default-apps".into(),
            "--disable-extensions".into(),
            "--no-pings".into(),
            "--disable-domain-reliability".into(),
            "--disable-client-side-phishing-detection".into(),
            format!("--user-data-dir={}", profile.join("profile").display()),
        ];
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": args,
                "prefs": {
                    "download.default_directory": profile.join("downloads"),
                    "download.prompt_for_download": false,
                    "safebrowsing.enabled": false,
                },
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let answer = self
            .call(reqwest::Method::POST, "/session", Some(capabilities))
            .await;
        answer["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session in {answer}"))
            .to_string()
    }

    /// One WebDriver command; answers its `value`, and fails the test on a WebDriver error.
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        self.try_call(method.clone(), path, body)
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// One WebDriver command; answers its `value`, or the WebDriver error's JSON.
    async fn try_call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, Value> {
        let url = format!("http://127.0.0.1:{}{path}", self.driver_port);
        let mut request = self.http.request(method.clone(), &url);
        if let Some(body) = body {
            request = request.json(&body);
        } else if method == reqwest::Method::POST {
            request = request.json(&json!({}));
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = response.status();
        let value: Value = response.json().await.expect("WebDriver answers JSON");
        if status.is_success() {
            Ok(value["value"].clone())
        } else {
            Err(value["value"].clone())
        }
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        self.call(method, &path, body).await
    }

    /// Opens a URL.
    pub async fn goto(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    /// The URL the page is at now.
    pub async fn url(&self) -> String {
        self.command(reqwest::Method::GET, "/url", None)
            .await
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Runs a script in the page (a function body: `arguments` are `args`) and answers its result.
    pub async fn eval(&self, script: &str, args: Value) -> Value {
        self.command(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
        .await
    }

    /// Waits until `script` answers something other than `null`, `false` or an empty list, and
    /// answers that; after [`CEILING`] fails the test naming `what`, with a screenshot.
    pub async fn wait_for(&self, what: &str, script: &str, args: Value) -> Value {
        let deadline = Instant::now() + CEILING;
        loop {
            let v = self.eval(script, args.clone()).await;
            let done = match &v {
                Value::Null | Value::Bool(false) => false,
                Value::Array(a) => !a.is_empty(),
                _ => true,
            };
            if done {
                return v;
            }
            if Instant::now() > deadline {
                let shot = self.screenshot(&failure_name(what)).await;
                panic!(
                    "{what}: not so within {CEILING:?} (last answer {v}); the page is in {}",
                    shot.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The first element that matches `css`, waiting for one to exist.
    pub async fn find(&self, css: &str) -> String {
        let deadline = Instant::now() + CEILING;
        let path = format!("/session/{}/element", self.session);
        let query = json!({"using": "css selector", "value": css});
        loop {
            match self
                .try_call(reqwest::Method::POST, &path, Some(query.clone()))
                .await
            {
                Ok(v) => {
                    return v[ELEMENT]
                        .as_str()
                        .unwrap_or_else(|| panic!("an element reference in {v}"))
                        .to_string();
                }
                Err(e) if e["error"] != "no such element" => panic!("finding {css:?}: {e}"),
                Err(_) => {}
            }
            if Instant::now() > deadline {
                let shot = self.screenshot(&failure_name(css)).await;
                panic!(
                    "no element {css:?} within {CEILING:?}; the page is in {}",
                    shot.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Clicks the first element that matches `css`, as a person would. The page redraws its
    /// tables as it refreshes, so an element found may be replaced before the click lands: it
    /// is then found again, as a person would aim again at the same button.
    pub async fn click(&self, css: &str) {
        let deadline = Instant::now() + CEILING;
        loop {
            let id = self.find(css).await;
            let path = format!("/session/{}/element/{id}/click", self.session);
            match self.try_call(reqwest::Method::POST, &path, None).await {
                Ok(_) => return,
                Err(e) if e["error"] == "stale element reference" && Instant::now() < deadline => {
                    continue;
                }
                Err(e) => panic!("clicking {css:?}: {e}"),
            }
        }
    }

    /// Replaces the text of the input that matches `css` with `text`, typed key by key.
    pub async fn type_into(&self, css: &str, text: &str) {
        let id = self.find(css).await;
        self.command(reqwest::Method::POST, &format!("/element/{id}/clear"), None)
            .await;
        self.command(
            reqwest::Method::POST,
            &format!("/element/{id}/value"),
            Some(json!({"text": text})),
        )
        .await;
    }

    /// Chooses the option with value `value` of the select that matches `css`.
    pub async fn select(&self, css: &str, value: &str) {
        self.click(&format!("{css} option[value=\"{value}\"]"))
            .await;
    }

    /// Writes a screenshot of the page to `target/ui-screenshots/NAME.png`, the window made as
    /// tall as the open view for it (and put back after), so that the picture has no empty half.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let fit = self
            .eval(
                "const view = document.querySelector('.view:not([hidden])');
                 const footer = document.querySelector('footer');
                 if (!view || !footer) return null;
                 const content = view.getBoundingClientRect().bottom + window.scrollY + 18 + footer.offsetHeight;
                 return [Math.ceil(content), window.outerHeight - window.innerHeight];",
                json!([]),
            )
            .await;
        // At the window's width (a test may have narrowed it), as tall as the page; then back.
        let rect = self
            .command(reqwest::Method::GET, "/window/rect", None)
            .await;
        let (width, height) = (
            rect["width"].as_i64().unwrap_or(WINDOW.0),
            rect["height"].as_i64().unwrap_or(WINDOW.1),
        );
        let resized = match fit.as_array().map(|a| (a[0].as_i64(), a[1].as_i64())) {
            Some((Some(content), Some(frame))) if content < WINDOW.1 => {
                self.resize(width, content.max(360) + frame).await;
                Some((width, height))
            }
            _ => None,
        };
        let png = self
            .command(reqwest::Method::GET, "/screenshot", None)
            .await;
        if let Some((width, height)) = resized {
            self.resize(width, height).await;
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("a base64 PNG"))
            .expect("valid base64");
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// Sets the window's outer size, as a person resizing it would.
    pub async fn resize(&self, width: i64, height: i64) {
        self.command(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        )
        .await;
    }

    /// The browser console's entries since the last call: `(level, source, message)`.
    pub async fn console(&self) -> Vec<(String, String, String)> {
        let v = self
            .command(
                reqwest::Method::POST,
                "/se/log",
                Some(json!({"type": "browser"})),
            )
            .await;
        v.as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                let field = |name: &str| e[name].as_str().unwrap_or_default().to_string();
                (field("level"), field("source"), field("message"))
            })
            .collect()
    }

    /// Fails the test on any console error that is not an API answer's status (a 401 or 403
    /// the page asked for on purpose): a script error, or anything the policy refused.
    pub async fn assert_no_console_errors(&self) {
        let errors: Vec<_> = self
            .console()
            .await
            .into_iter()
            .filter(|(level, source, _)| level == "SEVERE" && source != "network")
            .collect();
        assert!(errors.is_empty(), "console errors: {errors:#?}");
    }

    /// The folder downloads land in.
    pub fn downloads(&self) -> PathBuf {
        self.profile.path().join("downloads")
    }

    /// Ends the session (the browser exits), then chromedriver; the profile is removed on drop.
    pub async fn close(mut self) {
        self.command(reqwest::Method::DELETE, "", None).await;
        self.session.clear();
        // Drop ends chromedriver's group and removes the profile.
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            // A test that failed on the way: end the session with a plain request, since no
            // runtime can be borrowed here; the process group goes next either way.
            let _ = delete_session(self.driver_port, &self.session);
        }
        let group = Pid::from_raw(self.driver.id() as i32);
        let _ = killpg(group, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.driver.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // The browser's processes are in chromedriver's group; whatever outlived SIGTERM goes.
        let _ = killpg(group, Signal::SIGKILL);
        let _ = self.driver.wait();
    }
}

/// The name of the screenshot taken when waiting for `what` failed.
fn failure_name(what: &str) -> String {
    let name: String = what
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(60)
        .collect();
    format!("failed-{name}")
}

fn delete_session(port: u16, session: &str) -> std::io::Result<()> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "DELETE /session/{session} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    Ok(())
}
