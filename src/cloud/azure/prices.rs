//! The Azure Retail Prices API: the pay-as-you-go price of this VM's size in its region, for
//! Linux, from the `Consumption` meter of a regular VM or the Spot meter of a Spot VM. It needs
//! no credentials. A price in another currency than USD is no price, and a price far from every
//! other row of its size is implausible.

use std::time::Duration;

use serde::Deserialize;

pub const API_VERSION: &str = "2023-01-01-preview";
/// An earlier api-version, whose filter values are not case-sensitive (from 2023-01-01-preview
/// they are): asked when the size as instance metadata spells it lists nothing, since the
/// catalogue may spell it otherwise (`standard_nc24ads_a100_v4`, `Standard_NC24ads_A100_v4`).
pub const CASELESS_API_VERSION: &str = "2021-10-01-preview";
/// The most pages read: one size in one region is a page of a few rows.
const MAX_PAGES: usize = 5;
const MAX_BODY: usize = 4 * 1024 * 1024;

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct Page {
    items: Vec<Item>,
    next_page_link: Option<String>,
}

#[derive(Deserialize, Default, Debug, Clone)]
#[serde(rename_all = "camelCase", default)]
pub struct Item {
    pub currency_code: String,
    pub retail_price: f64,
    pub arm_region_name: String,
    pub arm_sku_name: String,
    pub meter_name: String,
    pub product_name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub unit_of_measure: String,
    /// A row of a non-primary meter region (the 2023 api-version lists them too).
    pub is_primary_meter_region: Option<bool>,
}

/// What the price list says of a size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Listed {
    /// Its price, in USD an hour.
    Price(f64),
    /// A price more than `cost::price::IMPLAUSIBLE_RATIO` from every other hourly row of the
    /// size, and the nearest of those: a catalogue's error (a $9,999/h row for a $3.67 VM), not
    /// a price.
    Implausible { usd_per_hour: f64, beside: f64 },
}

impl Item {
    /// An hourly row of `size` in `region`, of a primary meter region: any meter's.
    fn of(&self, region: &str, size: &str) -> bool {
        self.arm_region_name.eq_ignore_ascii_case(region)
            && self.arm_sku_name.eq_ignore_ascii_case(size)
            && matches!(self.kind.as_str(), "Consumption" | "DevTestConsumption")
            && self.is_primary_meter_region != Some(false)
            && self.unit_of_measure == "1 Hour"
    }

    /// The Linux pay-as-you-go row (`Spot` for a Spot VM), never a Low Priority, Windows,
    /// Dev/Test or Cloud Services one.
    fn linux(&self, spot: bool) -> bool {
        self.kind == "Consumption"
            && !self.product_name.ends_with(" Windows")
            && !self.product_name.contains("Cloud Services")
            && !self.meter_name.ends_with(" Low Priority")
            && self.meter_name.ends_with(" Spot") == spot
    }
}

/// The price of `size` in `region` among `items`: the Linux pay-as-you-go meter (`Spot` for a
/// Spot VM), never a Low Priority, Windows, Dev/Test or reservation one; implausible when it is
/// far from every other hourly row of the size. `Err` says why there is none.
pub fn pick(items: &[Item], region: &str, size: &str, spot: bool) -> Result<Listed, String> {
    let (rows, others): (Vec<&Item>, Vec<&Item>) = items
        .iter()
        .filter(|i| i.of(region, size))
        .partition(|i| i.linux(spot));
    let meter = if spot { "Spot" } else { "pay-as-you-go" };
    let Some(row) = rows.first() else {
        return Err(format!(
            "the Retail Prices API lists no Linux {meter} price for {size} in {region}"
        ));
    };
    if rows
        .iter()
        .any(|r| r.retail_price != row.retail_price || r.currency_code != row.currency_code)
    {
        return Err(format!(
            "the Retail Prices API lists several Linux {meter} prices for {size} in {region}"
        ));
    }
    if row.currency_code != "USD" {
        return Err(format!(
            "the price of {size} is in {}, not USD",
            crate::redact::brief(&row.currency_code, 8)
        ));
    }
    let price = crate::cost::parse_hourly_usd(&row.retail_price.to_string())
        .ok_or_else(|| format!("{} is not an hourly price", row.retail_price))?;
    let beside: Vec<f64> = others
        .iter()
        .filter(|o| o.currency_code == row.currency_code && o.retail_price > 0.0)
        .map(|o| o.retail_price)
        .collect();
    if !beside.is_empty()
        && beside
            .iter()
            .all(|b| crate::cost::price::implausible(price, *b))
    {
        let ratio = |b: &f64| (price / b).max(b / price);
        let nearest = beside
            .iter()
            .copied()
            .min_by(|a, b| ratio(a).total_cmp(&ratio(b)))
            .unwrap_or(price);
        return Ok(Listed::Implausible {
            usd_per_hour: price,
            beside: nearest,
        });
    }
    Ok(Listed::Price(price))
}

/// Asks the Retail Prices API at `base` for `size` in `region`: as instance metadata spells the
/// size, then, if the price list has no row of it so spelt, without regard to case.
pub async fn price(base: &str, region: &str, size: &str, spot: bool) -> Result<Listed, String> {
    let client = crate::client::http_client()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())?;
    let mut items = ask(&client, base, API_VERSION, region, size).await?;
    if !items.iter().any(|i| i.of(region, size)) {
        items = ask(&client, base, CASELESS_API_VERSION, region, size).await?;
    }
    pick(&items, region, size, spot)
}

/// The rows the Retail Prices API at `base` lists for `size` in `region`, asked in
/// `api_version`.
async fn ask(
    client: &reqwest::Client,
    base: &str,
    api_version: &str,
    region: &str,
    size: &str,
) -> Result<Vec<Item>, String> {
    let quote = |v: &str| v.replace('\'', "''");
    let filter = format!(
        "serviceName eq 'Virtual Machines' and armRegionName eq '{}' and armSkuName eq '{}' and priceType eq 'Consumption'",
        quote(region),
        quote(size)
    );
    // As the documents write it: `$filter` as is, spaces as `%20`, quotes as `%27`. The
    // earlier api-version lists only primary meter regions when asked.
    let base = base.trim_end_matches('/');
    let primary = if api_version == CASELESS_API_VERSION {
        "&meterRegion=%27primary%27"
    } else {
        ""
    };
    let url = format!(
        "{base}/api/retail/prices?api-version={api_version}{primary}&currencyCode=%27USD%27&$filter={}",
        crate::cloud::rest::encode(&filter)
    );
    let mut items = Vec::new();
    let mut next = Some(url);
    for _ in 0..MAX_PAGES {
        let Some(page_url) = next.take() else { break };
        // A next page is read only from the same API.
        if !crate::cloud::rest::same_origin(base, &page_url) {
            return Err("the next page link is elsewhere than the Retail Prices API".into());
        }
        let response = client
            .get(&page_url)
            .send()
            .await
            .map_err(|e| crate::redact::urls(&e.to_string()))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!(
                "the Retail Prices API answered HTTP {}",
                status.as_u16()
            ));
        }
        let body = crate::client::read_body(response, MAX_BODY)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the Retail Prices API's answer is too large")?;
        let page: Page = serde_json::from_slice(&body)
            .map_err(|e| format!("the Retail Prices API's answer does not parse: {e}"))?;
        items.extend(page.items);
        next = page.next_page_link.filter(|l| !l.is_empty());
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(meter: &str, product: &str, kind: &str, price: f64, currency: &str) -> Item {
        Item {
            currency_code: currency.into(),
            retail_price: price,
            arm_region_name: "eastus".into(),
            arm_sku_name: "Standard_NC24ads_A100_v4".into(),
            meter_name: meter.into(),
            product_name: product.into(),
            kind: kind.into(),
            unit_of_measure: "1 Hour".into(),
            is_primary_meter_region: Some(true),
        }
    }

    #[test]
    fn the_linux_meter_of_the_lifecycle_is_picked() {
        let series = "Virtual Machines NCadsA100v4 Series";
        let items = vec![
            item(
                "NC24ads A100 v4",
                &format!("{series} Windows"),
                "Consumption",
                4.41,
                "USD",
            ),
            item(
                "NC24ads A100 v4 Low Priority",
                series,
                "Consumption",
                0.73,
                "USD",
            ),
            item("NC24ads A100 v4", series, "Reservation", 19_000.0, "USD"),
            item("NC24ads A100 v4", series, "DevTestConsumption", 3.0, "USD"),
            item("NC24ads A100 v4 Spot", series, "Consumption", 0.7345, "USD"),
            item("NC24ads A100 v4", series, "Consumption", 3.673, "USD"),
        ];
        let (region, size) = ("eastus", "Standard_NC24ads_A100_v4");
        assert_eq!(pick(&items, region, size, false), Ok(Listed::Price(3.673)));
        assert_eq!(pick(&items, region, size, true), Ok(Listed::Price(0.7345)));
        // The size as instance metadata may spell it.
        assert_eq!(
            pick(&items, region, "standard_nc24ads_a100_v4", false),
            Ok(Listed::Price(3.673))
        );
        let why = pick(&items, "westus", size, false).unwrap_err();
        assert!(why.contains("no Linux pay-as-you-go price"), "{why}");
        let eur = vec![item("NC24ads A100 v4", series, "Consumption", 3.4, "EUR")];
        assert!(pick(&eur, region, size, false)
            .unwrap_err()
            .contains("in EUR, not USD"));
        let two = vec![
            item("NC24ads A100 v4", series, "Consumption", 3.673, "USD"),
            item("NC24ads A100 v4", series, "Consumption", 9.9, "USD"),
        ];
        assert!(pick(&two, region, size, false)
            .unwrap_err()
            .contains("several"));
    }

    /// A Linux row more than twentyfold from every other hourly row of its size is
    /// implausible, beside the nearest of them; one near any of them, or with none to judge it
    /// by, is a price.
    #[test]
    fn a_linux_row_far_from_every_other_row_of_its_size_is_implausible() {
        let series = "Virtual Machines NCadsA100v4 Series";
        let windows = format!("{series} Windows");
        let linux = |p: f64| item("NC24ads A100 v4", series, "Consumption", p, "USD");
        let rest = || {
            vec![
                item("NC24ads A100 v4", &windows, "Consumption", 4.409, "USD"),
                item(
                    "NC24ads A100 v4 Spot",
                    &windows,
                    "Consumption",
                    1.4705,
                    "USD",
                ),
                item("NC24ads A100 v4 Spot", series, "Consumption", 0.7345, "USD"),
                item(
                    "NC24ads A100 v4 Low Priority",
                    series,
                    "Consumption",
                    0.7345,
                    "USD",
                ),
                item(
                    "NC24ads A100 v4",
                    series,
                    "DevTestConsumption",
                    3.673,
                    "USD",
                ),
                item("NC24ads A100 v4", series, "Reservation", 19_062.0, "USD"),
            ]
        };
        let with = |p: f64| {
            let mut items = rest();
            items.push(linux(p));
            items
        };
        let (region, size) = ("eastus", "Standard_NC24ads_A100_v4");
        let cases: &[(Vec<Item>, bool, Listed)] = &[
            (
                with(9_999.0),
                false,
                Listed::Implausible {
                    usd_per_hour: 9_999.0,
                    beside: 4.409,
                },
            ),
            (
                with(0.01),
                false,
                Listed::Implausible {
                    usd_per_hour: 0.01,
                    beside: 0.7345,
                },
            ),
            // Near the Windows row alone is near enough.
            (with(80.0), false, Listed::Price(80.0)),
            (with(3.673), false, Listed::Price(3.673)),
            // Nothing to judge it by: a reservation's price is not an hourly one.
            (
                vec![
                    linux(9_999.0),
                    item("NC24ads A100 v4", series, "Reservation", 19_062.0, "USD"),
                ],
                false,
                Listed::Price(9_999.0),
            ),
            // A Spot VM's row is judged the same way.
            (
                {
                    let mut items = with(3.673);
                    items
                        .retain(|i| !(i.meter_name.ends_with(" Spot") && i.product_name == series));
                    items.push(item(
                        "NC24ads A100 v4 Spot",
                        series,
                        "Consumption",
                        500.0,
                        "USD",
                    ));
                    items
                },
                true,
                Listed::Implausible {
                    usd_per_hour: 500.0,
                    beside: 4.409,
                },
            ),
        ];
        for (items, spot, want) in cases {
            assert_eq!(pick(items, region, size, *spot), Ok(*want), "{want:?}");
        }
    }
}
