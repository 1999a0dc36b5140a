//! The operator page (`/ui`): its files as served over HTTP (types, policy, nothing from
//! elsewhere), and the page itself in a headless Chromium against a real server, as an operator
//! would use it, with a screenshot of each view in `target/ui-screenshots/`.

use snapfence_testkit::harness;

mod assets;
mod browser;
mod webdriver;
