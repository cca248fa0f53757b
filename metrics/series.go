package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// The series New makes, by family.

// newSessions makes the sessions: online, wanted, connects and their
// failures, disconnects, reach.
func (m *Metrics) newSessions(f promauto.Factory) {
	m.SessionsOnline = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "imcanary_sessions_online",
		Help: "Sessions logged in and not yet ended.",
	}, []string{"target", "source"})
	m.SessionsWanted = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "imcanary_sessions_wanted",
		Help: "Sessions the configuration asks to keep online.",
	}, []string{"target", "source"})
	m.SessionConnects = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_session_connects_total",
		Help: "Connect and login attempts, by result (success or failure), provisioning attempts included.",
	}, []string{"target", "source", "result"})
	m.ConnectFailures = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_session_connect_failures_total",
		Help: "Failed connect, login and provisioning attempts, by reason: refused, timeout, dns, tls, network, http_4xx, http_5xx, http_other, unauthorized, protocol, provisioning. They sum to imcanary_session_connects_total{result=\"failure\"}.",
	}, []string{"target", "source", "reason"})
	m.SessionDisconnects = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_session_disconnects_total",
		Help: "Sessions that ended, by reason: server_close, slow_consumer (the server's slow-reader close), error (network or protocol error), shutdown (imcanary's own), churn (imcanary logging a user out at the end of its session lifetime).",
	}, []string{"target", "source", "reason"})
	m.TargetReachable = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "imcanary_target_reachable",
		Help: "1 while imcanary can connect and log in to the target, 0 once the last attempts of every population failed (three in a row, or every one so far); imcanary_session_connect_failures_total says why.",
	}, []string{"target"})
}

// newSends makes what the senders record: sends, send errors, acks.
func (m *Metrics) newSends(f promauto.Factory) {
	m.MessagesSent = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_messages_sent_total",
		Help: "Probe messages written to the server.",
	}, []string{"target", "source", "kind"})
	m.SendErrors = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_send_errors_total",
		Help: "Intended sends that did not end in an ack, by reason.",
	}, []string{"target", "source", "reason"})
	m.AckLatency = f.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "imcanary_ack_latency_seconds",
		Help:    "Time from writing a message to the server's ack.",
		Buckets: LatencyBuckets,
	}, []string{"target", "source", "kind"})
}

// newDeliveries makes what the receivers record: deliveries by outcome,
// latencies, fan-out, lag.
func (m *Metrics) newDeliveries(f promauto.Factory) {
	m.DeliveriesExpected = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_deliveries_expected_total",
		Help: "Deliveries owed by the server: one per recipient of every acked message.",
	}, []string{"target", "source", "kind", "cohort"})
	m.Deliveries = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_deliveries_total",
		Help: "First deliveries of probe messages, on time or late (duplicates excluded).",
	}, []string{"target", "source", "kind", "cohort"})
	m.DeliveriesLost = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_deliveries_lost_total",
		Help: "Deliveries still missing lost_after past their intended send time.",
	}, []string{"target", "source", "kind", "cohort"})
	m.DeliveriesLate = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_deliveries_late_total",
		Help: "Deliveries that arrived after the deadline (a subset of imcanary_deliveries_total).",
	}, []string{"target", "source", "kind", "cohort"})
	m.DeliveriesDuplicate = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_deliveries_duplicate_total",
		Help: "Deliveries of a message the recipient had already received.",
	}, []string{"target", "source", "kind", "cohort"})
	m.DeliveriesReordered = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_deliveries_reordered_total",
		Help: "Deliveries that arrived after a later message of the same stream (a subset of imcanary_deliveries_total).",
	}, []string{"target", "source", "kind", "cohort"})
	m.DeliveriesIgnored = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_deliveries_ignored_total",
		Help: "Received frames not counted as deliveries, by reason.",
	}, []string{"target", "source", "reason"})
	m.DeliveryLatency = f.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "imcanary_delivery_latency_seconds",
		Help:    "Time from a message's intended send time to its delivery (open-loop: includes any delay in sending).",
		Buckets: LatencyBuckets,
	}, []string{"target", "source", "kind", "cohort"})
	m.DeliveriesRecovered = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_deliveries_recovered_total",
		Help: "Deliveries not pushed but fetched by catch-up (history, archive, recovery) before lost_after: neither on time nor lost, and not in imcanary_deliveries_total.",
	}, []string{"target", "source", "kind", "cohort"})
	m.DeliveriesLatePush = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_deliveries_late_push_total",
		Help: "Pushes of a message the device had already recovered by catch-up: the server pushed it after all, later than the catch-up grace (deadline/3). Of imcanary_deliveries_recovered_total, these were slow pushes; the rest were never pushed before lost_after.",
	}, []string{"target", "source", "kind", "cohort"})
	m.RecoveryLatency = f.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "imcanary_recovery_latency_seconds",
		Help:    "Time from a recovered message's intended send time to the moment catch-up returned it.",
		Buckets: LatencyBuckets,
	}, []string{"target", "source", "kind", "cohort"})
	m.MembershipChanges = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_group_membership_changes_total",
		Help: "Times a user of a behaviour class left or rejoined one of its groups (membership churn). A message the server acknowledged during a change, or within population.deadline after the server confirmed it, is neither owed to nor counted against that user.",
	}, []string{"target", "source"})
	m.GroupFanout = f.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "imcanary_group_fanout_seconds",
		Help:    "For each group message, time from its intended send time until the last member device online when it was sent had it (pushed or recovered), by the group's size class in members. A message some such device never got is not observed: it is counted lost. With population.across_shards, only the sender's shard observes a message, and for its own members only: the whole group's time is at least the highest shard's, which this bounds from below, not from above.",
		Buckets: LatencyBuckets,
	}, []string{"target", "source", "size_class"})
	m.DeliveriesSaturated = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_deliveries_saturated_total",
		Help: "Deliveries recorded while the prober was saturated (imcanary_probe_saturated 1): their latency samples include imcanary's own delay.",
	}, []string{"target", "source", "kind"})
	m.DeliveriesUnowed = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_deliveries_unowed_total",
		Help: "First deliveries (pushed or recovered) of messages the server never acknowledged to their sender (ack timeout, a reset that ate the ack, an ack after the timeout): never owed, so not in imcanary_deliveries_expected_total, imcanary_deliveries_total or imcanary_deliveries_recovered_total.",
	}, []string{"target", "source", "kind", "cohort"})
	m.DeliveryLag = f.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "imcanary_session_delivery_lag_messages",
		Help:    "Messages the server acknowledged to a session's conversations that the session has not received, sampled once per sweep for every online session.",
		Buckets: DeliveryLagBuckets,
	}, []string{"target", "source"})
	m.SessionsLagging = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "imcanary_sessions_lagging",
		Help: "Online sessions with a message acknowledged by the server longer ago than population.lag_threshold and neither it nor a later one of its stream received: a silent stall.",
	}, []string{"target", "source"})
}

// newProbe makes the prober's own health: its lags, saturation and its
// causes, CPU, ports, ledger size, readiness.
func (m *Metrics) newProbe(f promauto.Factory) {
	m.ProbeSendLag = f.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "imcanary_probe_send_lag_seconds",
		Help:    "How late imcanary wrote each message against its intended send time: the prober's own scheduling delay.",
		Buckets: LagBuckets,
	}, []string{"target"})
	m.ProbeReceiveLag = f.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "imcanary_probe_receive_lag_seconds",
		Help:    "Time from reading a frame off the socket to the ledger recording its delivery: the prober's own receive-path delay.",
		Buckets: LagBuckets,
	}, []string{"target"})
	m.ProbeSaturated = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "imcanary_probe_saturated",
		Help: "1 while imcanary is saturated and its latency and loss numbers cannot be trusted; imcanary_probe_saturation_cause says why.",
	}, []string{"target"})
	m.ProbeSaturationCause = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "imcanary_probe_saturation_cause",
		Help: "1 for each cause currently saturating imcanary, else 0.",
	}, []string{"target", "cause"})
	m.ProbeCPUUsage = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "imcanary_probe_cpu_usage_ratio",
		Help: "CPU time imcanary used over the last saturation window, per core it may use (GOMAXPROCS): 1 is every core busy.",
	}, []string{"target"})
	m.ProbePortUsage = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "imcanary_probe_ephemeral_port_usage_ratio",
		Help: "TCP sockets on ephemeral ports from a local address toward its fullest destination, per port of the ephemeral range (net.ipv4.ip_local_port_range), every program's: near 1, new connections from it to that destination fail. Connections to different destinations share ports, so it never passes 1; the ports cause is judged only toward destinations imcanary connects to.",
	}, []string{"target", "address"})
	m.StreamsTracked = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "imcanary_ledger_streams",
		Help: "Message streams the ledger is tracking (memory grows with these, not with uptime).",
	}, []string{"target", "source"})
	m.Ready = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "imcanary_population_ready",
		Help: "1 once the population has been fully online, else 0.",
	}, []string{"target", "source"})
}

// newRuns makes the canary rounds, the configuration's reloads and the soak
// runs.
func (m *Metrics) newRuns(f promauto.Factory) {
	m.CanaryRounds = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_canary_rounds_total",
		Help: "Canary rounds by message kind and result (pass or fail): the canary SLI's events.",
	}, []string{"target", "kind", "result"})
	m.CanaryFailures = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_canary_failures_total",
		Help: "Reasons canary rounds failed, by kind; a failed round may have several.",
	}, []string{"target", "kind", "reason"})
	m.CanarySkipped = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_canary_rounds_skipped_total",
		Help: "Scheduled canary rounds skipped because the previous one was still running.",
	}, []string{"target"})
	m.CanaryLastTimestamp = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "imcanary_canary_last_round_timestamp_seconds",
		Help: "Unix time the last canary round ended.",
	}, []string{"target"})
	m.CanaryLastSuccess = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "imcanary_canary_last_round_success",
		Help: "1 if the last canary round passed, else 0.",
	}, []string{"target"})
	m.CanaryNextRound = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "imcanary_canary_next_round_timestamp_seconds",
		Help: "Unix time the next canary round is due by the schedule, set at start and after each round that ran: once it lies well in the past, rounds have stopped.",
	}, []string{"target"})
	m.ConfigLastReloadOK = f.NewGauge(prometheus.GaugeOpts{
		Name: "imcanary_config_last_reload_successful",
		Help: "1 if the configuration last loaded (at start, or on reload) was applied, 0 if it was rejected and the one before it still runs.",
	})
	m.ConfigLastReloadSuccess = f.NewGauge(prometheus.GaugeOpts{
		Name: "imcanary_config_last_reload_success_timestamp_seconds",
		Help: "Unix time the configuration was last applied.",
	})
	m.SoakRuns = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_soak_runs_total",
		Help: "Soak runs by profile and result (pass, fail, aborted, inconclusive: a threshold missed while imcanary was saturated).",
	}, []string{"target", "profile", "result"})
	m.SoakSkipped = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_soak_runs_skipped_total",
		Help: "Scheduled soak runs skipped because another soak was running on the target.",
	}, []string{"target", "profile"})
	m.SoakLastSuccess = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "imcanary_soak_last_run_success",
		Help: "1 if the profile's last soak run passed, else 0.",
	}, []string{"target", "profile"})
	m.SoakRunning = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "imcanary_soak_running",
		Help: "1 while a soak run of the profile is in progress.",
	}, []string{"target", "profile"})
	m.SearchRuns = f.NewCounterVec(prometheus.CounterOpts{
		Name: "imcanary_search_runs_total",
		Help: "Searches for the server's limit by profile and result (found, no_limit, below_start, inconclusive: the prober was the limit, aborted). Their steps are not soak runs.",
	}, []string{"target", "profile", "result"})
	m.SearchKnee = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "imcanary_search_knee",
		Help: "The largest value of the profile's search.vary that passed in its last search that ended found or no_limit (then search.max), in that value's unit.",
	}, []string{"target", "profile"})
	m.SearchBaselineKnee = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "imcanary_search_baseline_knee",
		Help: "The knee of the search pinned as the profile's baseline, as its last search was compared with it.",
	}, []string{"target", "profile"})
}
