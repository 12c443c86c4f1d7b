//! The Azure Retail Prices API: the pay-as-you-go price of this VM's size in its region, for
//! Linux, from the `Consumption` meter of a regular VM or the Spot meter of a Spot VM. It needs
//! no credentials. A price in another currency than USD is no price.

use std::time::Duration;

use serde::Deserialize;

pub const API_VERSION: &str = "2023-01-01-preview";
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

/// The price of `size` in `region` among `items`: the Linux pay-as-you-go meter (`Spot` for a
/// Spot VM), never a Low Priority, Windows, Dev/Test or reservation one. `Err` says why none.
pub fn pick(items: &[Item], region: &str, size: &str, spot: bool) -> Result<f64, String> {
    let rows: Vec<&Item> = items
        .iter()
        .filter(|i| {
            i.arm_region_name.eq_ignore_ascii_case(region)
                && i.arm_sku_name.eq_ignore_ascii_case(size)
                && i.kind == "Consumption"
                && i.is_primary_meter_region != Some(false)
                && i.unit_of_measure == "1 Hour"
                && !i.product_name.ends_with(" Windows")
                && !i.product_name.contains("Cloud Services")
                && !i.meter_name.ends_with(" Low Priority")
                && i.meter_name.ends_with(" Spot") == spot
        })
        .collect();
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
    crate::cost::parse_hourly_usd(&row.retail_price.to_string())
        .ok_or_else(|| format!("{} is not an hourly price", row.retail_price))
}

/// Asks the Retail Prices API at `base` for `size` in `region`.
pub async fn price(base: &str, region: &str, size: &str, spot: bool) -> Result<f64, String> {
    let client = crate::client::http_client()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())?;
    let quote = |v: &str| v.replace('\'', "''");
    let filter = format!(
        "serviceName eq 'Virtual Machines' and armRegionName eq '{}' and armSkuName eq '{}' and priceType eq 'Consumption'",
        quote(region),
        quote(size)
    );
    // As the documents write it: `$filter` as is, spaces as `%20`, quotes as `%27`.
    let base = base.trim_end_matches('/');
    let url = format!(
        "{base}/api/retail/prices?api-version={API_VERSION}&currencyCode=%27USD%27&$filter={}",
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
    pick(&items, region, size, spot)
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
        assert_eq!(pick(&items, region, size, false), Ok(3.673));
        assert_eq!(pick(&items, region, size, true), Ok(0.7345));
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
}
