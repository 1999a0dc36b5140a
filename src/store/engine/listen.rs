//! The instance's one `LISTEN` connection, shared by the features that follow the database: each
//! subscribes to its channel with what to run on the connection once it listens, with each
//! notification, and at its own pace. A failed connection is lost to every subscriber and made
//! again after [`RELISTEN_AFTER`], the one re-listen policy. It never waits for the pool, so
//! what it does says that the instance answers, however busy it is. The connection also holds the
//! instance's liveness lock, named by its id, which PostgreSQL frees the moment the instance dies.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use tokio::sync::mpsc;

use super::Tasks;

/// How long a lost connection waits before it is made again.
pub(crate) const RELISTEN_AFTER: Duration = Duration::from_millis(250);

/// A feature following its channel.
pub(crate) trait Subscriber: Send + Sync + 'static {
    fn channel(&self) -> &'static str;

    /// Whether the feature is gone; the hub then listens without it.
    fn gone(&self) -> bool;

    /// Runs on the connection once it listens, before any notification is handed on, so nothing
    /// that happens after it goes unheard.
    fn listening<'a>(&'a self, conn: &'a mut PgListener) -> BoxFuture<'a, sqlx::Result<()>>;

    /// A notification on its channel; it may answer on the connection.
    fn heard<'a>(
        &'a self,
        payload: &'a str,
        conn: &'a mut PgListener,
    ) -> BoxFuture<'a, sqlx::Result<()>>;

    /// The connection is lost (`error` says why, if known): notifications go unheard until
    /// [`Subscriber::listening`] runs again.
    fn lost(&self, error: Option<&sqlx::Error>);

    /// How often [`Subscriber::tick`] runs while the connection listens, if at all.
    fn every(&self) -> Option<Duration> {
        None
    }

    fn tick<'a>(&'a self, _conn: &'a mut PgListener) -> BoxFuture<'a, sqlx::Result<()>> {
        Box::pin(async { Ok(()) })
    }
}

/// Hands each subscriber's notifications on; the connection ends with the last handle.
#[derive(Debug)]
pub(crate) struct Hub {
    subscribe: mpsc::UnboundedSender<Arc<dyn Subscriber>>,
    instance: Arc<AtomicI32>,
    _task: Tasks,
}

impl Hub {
    /// Connects once the first feature subscribes; needs a Tokio runtime.
    pub(crate) fn start(pool: &PgPool) -> Self {
        let (subscribe, subscriptions) = mpsc::unbounded_channel();
        let instance = Arc::new(AtomicI32::new(0));
        let task = tokio::spawn(run(listening_pool(pool), subscriptions, instance.clone()));
        Self {
            subscribe,
            instance,
            _task: Tasks(vec![task]),
        }
    }

    /// The instance's id, 0 until its connection first listens: its liveness lock's name (see
    /// `waiter_instance_alive` in the migrations), drawn once, so no two live instances share it.
    pub(crate) fn instance(&self) -> Arc<AtomicI32> {
        self.instance.clone()
    }

    pub(crate) fn subscribe(&self, subscriber: Arc<dyn Subscriber>) {
        // The task ends only with this handle, so it is there to receive.
        let _ = self.subscribe.send(subscriber);
    }
}

/// A pool of its own, so the listening session never reaches a serving connection.
fn listening_pool(pool: &PgPool) -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(pool.options().get_acquire_timeout())
        .connect_lazy_with((*pool.connect_options()).clone())
}

enum Ended {
    /// The connection failed or was lost.
    Lost(Option<sqlx::Error>),
    /// A feature subscribed or went: listen again at once, on a new connection.
    Changed,
}

async fn run(
    own: PgPool,
    mut subscriptions: mpsc::UnboundedReceiver<Arc<dyn Subscriber>>,
    instance: Arc<AtomicI32>,
) {
    let mut subscribers: Vec<Arc<dyn Subscriber>> = Vec::new();
    loop {
        if subscribers.is_empty() {
            match subscriptions.recv().await {
                Some(s) => subscribers.push(s),
                None => return,
            }
        }
        let ended = listen(&own, &mut subscribers, &mut subscriptions, &instance).await;
        for s in &subscribers {
            s.lost(match &ended {
                Ended::Lost(e) => e.as_ref(),
                Ended::Changed => None,
            });
        }
        subscribers.retain(|s| !s.gone());
        if let Ended::Lost(_) = ended {
            tokio::time::sleep(RELISTEN_AFTER).await;
        }
    }
}

async fn listen(
    own: &PgPool,
    subscribers: &mut Vec<Arc<dyn Subscriber>>,
    subscriptions: &mut mpsc::UnboundedReceiver<Arc<dyn Subscriber>>,
    instance: &AtomicI32,
) -> Ended {
    let mut listener = match PgListener::connect_with(own).await {
        Ok(listener) => listener,
        Err(e) => return Ended::Lost(Some(e)),
    };
    // A lost connection is told (`None`) and made again here, so every `listening` runs again.
    listener.eager_reconnect(false);
    while let Ok(s) = subscriptions.try_recv() {
        subscribers.push(s);
    }
    let heard = async {
        let channels: Vec<&str> = subscribers.iter().map(|s| s.channel()).collect();
        listener.listen_all(channels).await?;
        let mut id = instance.load(Ordering::Relaxed);
        if id == 0 {
            id = sqlx::query_scalar(include_str!("sql/instance_id.sql"))
                .fetch_one(&mut listener)
                .await?;
            instance.store(id, Ordering::Relaxed);
        }
        sqlx::query(include_str!("sql/instance_lock.sql"))
            .bind(id)
            .execute(&mut listener)
            .await?;
        for s in subscribers.iter() {
            s.listening(&mut listener).await?;
        }
        let every = subscribers.iter().filter_map(|s| s.every()).min();
        let mut ticks = tokio::time::interval(every.unwrap_or(Duration::from_secs(3600)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            // Reading a notification is cancel-safe: a tick or a subscription ends only the wait.
            let note = tokio::select! {
                note = listener.try_recv() => note?,
                _ = ticks.tick(), if every.is_some() => {
                    for s in subscribers.iter().filter(|s| s.every().is_some()) {
                        s.tick(&mut listener).await?;
                    }
                    continue;
                }
                Some(s) = subscriptions.recv() => {
                    subscribers.push(s);
                    return Ok(Ended::Changed);
                }
            };
            let Some(note) = note else {
                return Ok(Ended::Lost(None));
            };
            if subscribers.iter().any(|s| s.gone()) {
                return Ok(Ended::Changed);
            }
            for s in subscribers.iter().filter(|s| s.channel() == note.channel()) {
                s.heard(note.payload(), &mut listener).await?;
            }
        }
    };
    heard
        .await
        .unwrap_or_else(|e: sqlx::Error| Ended::Lost(Some(e)))
}
