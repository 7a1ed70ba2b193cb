package agentapi

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestKeepalivedConfigAdvertInterval: the interval travels as advertIntervalMS; a node config from an
// appliance that predates the field decodes to 0 (keepalived's 1 s default, what that appliance's
// speakers use), and 0 is left out of the JSON so such a config reads the same both ways.
func TestKeepalivedConfigAdvertInterval(t *testing.T) {
	b, err := json.Marshal(KeepalivedConfig{VirtualRouterID: 7, Priority: 100, AdvertIntervalMS: 250})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"advertIntervalMS":250`) {
		t.Errorf("JSON %s lacks \"advertIntervalMS\":250", b)
	}
	var k KeepalivedConfig
	if err := json.Unmarshal(b, &k); err != nil || k.AdvertInterval() != 250*time.Millisecond {
		t.Errorf("round trip: %+v, %v; want AdvertInterval() 250ms", k, err)
	}

	old := `{"virtualRouterID":75,"authPass":"vrrppass","priority":100,"peers":["10.100.0.12"]}`
	k = KeepalivedConfig{}
	if err := json.Unmarshal([]byte(old), &k); err != nil || k.AdvertInterval() != 0 || k.VirtualRouterID != 75 {
		t.Errorf("node config of an older appliance: %+v, %v; want AdvertInterval() 0", k, err)
	}
	b, _ = json.Marshal(k)
	if strings.Contains(string(b), "advertInterval") {
		t.Errorf("an unset interval is written: %s", b)
	}
}
