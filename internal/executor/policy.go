package executor

import (
	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// Policies resolve a job's failure policy from four levels: for each
// field, the job's own policy wins, then its type's (its handler's, when
// the handler has a Policy method), its queue's and the platform's; the
// default applies when none sets it. A nil limit or a zero duration is
// "not set".
type Policies struct {
	Queues   map[string]wire.Policy // each queue's
	Platform wire.Policy
	Defaults decide.Policy
}

// typePolicy is a Handler that carries its job type's policy.
type typePolicy interface {
	Policy() wire.Policy
}

// Of is the failure policy of j, whose handler is h (nil: none).
func (ps *Policies) Of(j *Job, h any) decide.Policy {
	pol := j.Policy
	if tp, ok := h.(typePolicy); ok {
		pol = Merge(pol, tp.Policy())
	}
	return Resolve(Merge(Merge(pol, ps.Queues[j.Queue]), ps.Platform), ps.Defaults)
}

// Merge returns p with every unset field taken from q.
func Merge(p, q wire.Policy) wire.Policy {
	if p.RetryLimit == nil {
		p.RetryLimit = q.RetryLimit
	}
	if p.PoisonLimit == nil {
		p.PoisonLimit = q.PoisonLimit
	}
	if p.BackoffBase == 0 {
		p.BackoffBase = q.BackoffBase
	}
	if p.BackoffCap == 0 {
		p.BackoffCap = q.BackoffCap
	}
	if p.Timeout == 0 {
		p.Timeout = q.Timeout
	}
	return p
}

// Resolve returns p with every unset field taken from d.
func Resolve(p wire.Policy, d decide.Policy) decide.Policy {
	if p.RetryLimit != nil {
		d.RetryLimit = *p.RetryLimit
	}
	if p.PoisonLimit != nil {
		d.PoisonLimit = *p.PoisonLimit
	}
	if p.BackoffBase != 0 {
		d.BackoffBase = p.BackoffBase
	}
	if p.BackoffCap != 0 {
		d.BackoffCap = p.BackoffCap
	}
	if p.Timeout != 0 {
		d.Timeout = p.Timeout
	}
	return d
}
