package dialects

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckRequeue(t *testing.T) {
	grouped := Table{Name: "jobs", ID: "id", Payload: "payload", Group: "queue"}
	plain := Table{Name: "jobs", ID: "id", Payload: "payload"}
	for _, c := range []struct {
		spec RequeueSpec
		want string // "" for accepted
	}{
		{RequeueSpec{Table: grouped, FromGroup: "dead", ToGroup: "jobs"}, ""},
		{RequeueSpec{Table: grouped, FromGroup: "dead", ToGroup: ""}, ""}, // '' is a group like any other
		{RequeueSpec{Table: plain, FromTable: "jobs_dead"}, ""},
		{RequeueSpec{Table: grouped, FromTable: "jobs_dead", Chunk: 10}, ""},
		{RequeueSpec{Table: grouped}, "no dead letters named"},
		{RequeueSpec{Table: grouped, FromGroup: "dead", FromTable: "jobs_dead"}, "not both"},
		{RequeueSpec{Table: plain, FromGroup: "dead", ToGroup: "jobs"}, "needs the table's group column"},
		{RequeueSpec{Table: grouped, FromGroup: "dead", ToGroup: "dead"}, "to itself"},
		{RequeueSpec{Table: plain, FromTable: "jobs_dead", ToGroup: "jobs"}, "keep their group"},
		{RequeueSpec{Table: plain, FromTable: "JOBS"}, "the queue table itself"},
		{RequeueSpec{Table: plain, FromTable: "other.jobs_dead"}, "without a dot"},
		{RequeueSpec{Table: plain, FromTable: "jobs_dead", Chunk: -1}, "negative"},
		{RequeueSpec{Table: Table{Name: "jobs", ID: "id"}, FromTable: "jobs_dead"}, "payload column is required"},
	} {
		err := CheckRequeue(c.spec)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v, want accepted", c.spec, err)
		case c.want != "" && (!errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: %v, want a *ConfigError saying %q", c.spec, err, c.want)
		}
	}
}
